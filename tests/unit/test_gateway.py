"""What the gateway forwards and serve's exposure warning, without a server.

The token check, body limit and error shapes are the shared guard's: tests/unit/test_guard.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.runtimes.torchserve.bodies import FORWARDED_TYPES, BodyError, upstream_body
from pipeline.runtimes.torchserve.launch import ServeConfig, exposure_warning


def _key_file(path: Path, key: str) -> Path:
    path.write_text(json.dumps({"inference": {"key": key}, "management": {"key": "m"}}))
    return path


def test_a_non_loopback_address_is_warned_about() -> None:
    assert exposure_warning(ServeConfig()) is None
    assert exposure_warning(ServeConfig(host="::1")) is None
    warning = exposure_warning(ServeConfig(host="0.0.0.0"))
    assert warning is not None
    assert "0.0.0.0" in warning and "clear text" in warning
    with_tls = exposure_warning(
        ServeConfig(host="0.0.0.0", tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    )
    assert with_tls is not None and "clear text" not in with_tls


def test_worker_plan_fills_the_cores_with_one_thread_each() -> None:
    import psutil

    from pipeline.runtimes.torchserve.launch import worker_plan

    cores = psutil.cpu_count(logical=False) or 1
    assert worker_plan(1) == (cores, 1)
    assert worker_plan(cores * 4) == (1, 1)  # more models than cores: never below one
    assert worker_plan(1, workers=1) == (1, cores)
    assert worker_plan(3, workers=2, threads=5) == (2, 5)  # what the user asks for wins


# --- what the gateway forwards (pipeline.runtimes.torchserve.bodies) ---------------------------------

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR%zz=%"  # '%' before non-hex: TorchServe's form decoder 500s
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF"
NPY = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'"
NPZ = b"PK\x03\x04\x14\x00\x00\x00"
JSON = b'{"inputs": [[1e+05, 2.5]]}'
FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize(
    ("body", "sniffed"),
    [
        (PNG, "image/png"),
        (JPEG, "image/jpeg"),
        (NPY, "application/octet-stream"),
        (NPZ, "application/octet-stream"),
        (JSON, "application/json"),
        (b" \n[1]", "application/json"),
        (b"a=%zz&b", "application/octet-stream"),
        (b"", "application/octet-stream"),
    ],
)
def test_bodies_without_a_usable_type_are_forwarded_as_what_they_are(
    body: bytes, sniffed: str
) -> None:
    for declared in (None, "", FORM, f"{FORM}; charset=utf-16", "Application/X-WWW-Form-Urlencoded",
                     "text/plain", "image/gif", ";;;", "multipart/mixed; boundary=x",
                     "multipart/form-data"):  # fmt: skip
        assert upstream_body(declared, body) == (body, sniffed), declared


def test_the_content_wins_and_unknown_bodies_keep_a_type_torchserve_passes_through() -> None:
    assert upstream_body("image/png", JSON) == (JSON, "application/json")
    assert upstream_body("application/json", PNG) == (PNG, "image/png")
    assert upstream_body("application/json", NPZ) == (NPZ, "application/octet-stream")
    for declared, forwarded in (
        ("Application/JSON; charset=nonexistent", "application/json"),
        ("image/jpeg", "image/jpeg"),
        ("application/octet-stream", "application/octet-stream"),
        ("text/plain", "application/octet-stream"),
        (FORM, "application/octet-stream"),
    ):
        assert upstream_body(declared, b"hello") == (b"hello", forwarded)


def _form(*parts: tuple[str | None, bytes, str | None], boundary: str = "x") -> bytes:
    out = b""
    for name, data, ctype in parts:
        disposition = "form-data" + (f'; name="{name}"' if name else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        out += f"Content-Type: {ctype}\r\n".encode() if ctype else b""
        out += b"\r\n" + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_a_multipart_form_is_replaced_by_its_file() -> None:
    mp = "multipart/form-data; boundary=x"
    assert upstream_body(mp, _form(("data", PNG, "image/png"))) == (PNG, "image/png")
    # curl -F data=@file without a type, TorchServe's other name, the only unnamed part:
    assert upstream_body(mp, _form(("body", NPZ, None))) == (NPZ, "application/octet-stream")
    assert upstream_body(mp, _form((None, JSON, "text/plain"))) == (JSON, "application/json")
    assert upstream_body(mp, _form(("meta", b"x", None), ("data", JSON, FORM))) == (
        JSON,
        "application/json",
    )
    # base64 and quoted-printable parts are decoded (TorchServe's decoder answered 500)
    b64 = b'--x\r\nContent-Disposition: form-data; name="data"\r\n'
    b64 += b"Content-Transfer-Encoding: base64\r\n\r\neyJpbnB1dHMiOiBbMV19\r\n--x--\r\n"
    assert upstream_body(mp, b64) == (b'{"inputs": [1]}', "application/json")
    # Binary data with CR/LF inside comes through byte for byte.
    data = bytes(range(256)) + b"\r\n--y\r\n\r\n" + bytes(range(256)) + b"\r\n\r\n"
    assert upstream_body(mp, _form(("data", data, None)))[0] == data


def test_a_form_with_several_parts_and_no_file_is_refused() -> None:
    body = _form(("a", b"1", None), ("b", b"2", None))
    with pytest.raises(BodyError, match=r"2 parts named \['a', 'b'\]; send one part named 'data'"):
        upstream_body("multipart/form-data; boundary=x", body)
    # A "form" in which no part is found is the raw body it probably is.
    for declared in (
        "multipart/form-data",
        "multipart/form-data; boundary=",
        "multipart/form-data; boundary=q",
    ):
        assert upstream_body(declared, _form(("data", PNG, None))) == (
            _form(("data", PNG, None)),
            "application/octet-stream",
        )
        assert upstream_body(declared, PNG) == (PNG, "image/png")


content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            FORM,
            "multipart/form-data; boundary=x",
            "multipart/form-data",
            "application/json",
            "image/png",
            "text/plain; charset=nonexistent",
            "",
            "multipart/form-data; boundary=",
        ]
    ),
    st.text(max_size=60),
)
bodies = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([PNG, JPEG, NPY, NPZ, JSON, b"--x\r\n"]).flatmap(
        lambda prefix: st.binary(max_size=200).map(lambda tail: prefix + tail)
    ),
    st.lists(st.tuples(st.sampled_from(["data", "body", "x", None]), st.binary(max_size=60),
                       st.sampled_from([None, "image/png", FORM, "text/plain"])),
             max_size=3).map(lambda parts: _form(*parts)),
)  # fmt: skip


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(content_types, bodies)
def test_torchserve_is_never_handed_a_form(declared: str | None, body: bytes) -> None:
    """Whatever the client sends, TorchServe gets one of four media types, or the gateway
    answers 400 itself; nothing else escapes (it would be the gateway's 500)."""
    try:
        forwarded, media = upstream_body(declared, body)
    except BodyError as err:
        message = str(err)
    else:
        assert media in FORWARDED_TYPES
        assert isinstance(forwarded, bytes)
        return
    assert "multipart form" in message


def test_a_request_in_flight_when_a_worker_dies_is_sent_again(tmp_path: Path) -> None:
    """The gateway's own resend path: a stand-in upstream that never answers the first
    request (as TorchServe 0.12 often does for a killed worker's batch) and answers the
    second; the death notice cancels the first and the client gets the second's answer."""
    import asyncio

    from aiohttp import ClientSession, web

    from pipeline.runtimes.torchserve.gateway import WORKER_WATCH, GatewayConfig, build_app

    async def scenario() -> tuple[int, dict, int, int]:
        calls = 0
        first_arrived, release = asyncio.Event(), asyncio.Event()

        async def predict(request: web.Request) -> web.Response:
            nonlocal calls
            calls += 1
            await request.read()
            if calls == 1:
                first_arrived.set()
                await release.wait()  # the dead worker's request: no answer until the end
            return web.json_response({"answer": calls})

        upstream = web.Application()
        upstream.router.add_post("/predictions/{model}", predict)
        up_runner = web.AppRunner(upstream)
        await up_runner.setup()
        up_site = web.TCPSite(up_runner, "127.0.0.1", 0)
        await up_site.start()
        up_port = up_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        config = GatewayConfig(
            host="127.0.0.1",
            port=0,
            upstream=f"http://127.0.0.1:{up_port}",
            key_file=str(_key_file(tmp_path / "key_file.json", "k1")),
            max_request_size=1024,
        )
        app = build_app(config)
        gw_runner = web.AppRunner(app)
        await gw_runner.setup()
        gw_site = web.TCPSite(gw_runner, "127.0.0.1", 0)
        await gw_site.start()
        gw_port = gw_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with ClientSession() as http:
                sent = asyncio.ensure_future(
                    http.post(
                        f"http://127.0.0.1:{gw_port}/predictions/m",
                        data=b"{}",
                        headers={"Authorization": "Bearer k1"},
                    )
                )
                await asyncio.wait_for(first_arrived.wait(), 10)
                watch = app[WORKER_WATCH]
                in_flight = len(watch.inflight)
                watch.resend_in_flight({12345})
                resp = await asyncio.wait_for(sent, 10)
                body = await resp.json()
                status = resp.status
                left = len(watch.inflight) + len(watch.resend)
        finally:
            release.set()
            await gw_runner.cleanup()
            await up_runner.cleanup()
        return status, body, in_flight, calls + 10 * left

    status, body, in_flight, calls = asyncio.run(scenario())
    assert in_flight == 1
    assert (status, body) == (200, {"answer": 2})
    assert calls == 2  # sent twice, and no task left registered afterwards


def test_a_model_name_reaches_the_one_archive_serving_it(tmp_path: Path) -> None:
    """`/predictions/digits_lenet` reaches whichever format `pipeline serve` chose."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from pipeline.runtimes.torchserve.gateway import GatewayConfig, build_app

    seen: list[str] = []

    async def upstream(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"outputs": {}})

    async def main() -> list[int]:
        up = web.Application()
        up.router.add_post("/predictions/{tail:.*}", upstream)
        async with TestServer(up) as up_server:
            config = GatewayConfig(
                host="127.0.0.1",
                port=0,
                upstream=str(up_server.make_url("")).rstrip("/"),
                key_file=str(_key_file(tmp_path / "key_file.json", "k")),
                max_request_size=1024,
                aliases={"digits_lenet": "digits_lenet_onnx"},
            )
            async with TestClient(TestServer(build_app(config))) as gateway:
                statuses = []
                for path in ("digits_lenet", "digits_lenet/1.0", "digits_lenet_ts"):
                    resp = await gateway.post(
                        f"/predictions/{path}", data=JSON, headers={"Authorization": "Bearer k"}
                    )
                    statuses.append(resp.status)
                return statuses

    assert asyncio.run(main()) == [200, 200, 200]
    assert seen == [
        "/predictions/digits_lenet_onnx",
        "/predictions/digits_lenet_onnx/1.0",
        "/predictions/digits_lenet_ts",  # an archive's own name is never rewritten
    ]
