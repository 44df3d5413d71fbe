"""The layer every stage stands on: errors, paths, files, the manifest, checkpoints, comparison."""
