"""The exporter's GPUs read from dcgm-exporter (`--collector.gpu.dcgm-exporter`): the real
capture in each of dcgm-exporter's label spellings, damaged and hostile bodies, a slow or
silent dcgm-exporter that must not hold the sampler, and the whole path end to end: captured
dcgm-exporter -> trainprof exporter -> a real Prometheus running the rules compiled for the
`trainprof` source, which fire."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

import trainprof.exporter
from real_exporters import (
    DCGM,
    ScriptedExporters,
    exposition,
    gpu_labels,
    mig_instances,
    read_capture,
    serve,
    variant,
)
from trainprof.cli import main
from trainprof.contract.sampling import HostSample
from trainprof.exporter.sources import dcgm_exporter
from trainprof.exporter.sources.dcgm_exporter import DcgmExporterSource, FetchError, parse
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from fakes import ScriptedCpu
from servers import _loopback, prometheus, query, wait_for

UUID = "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c"


def body(labels: dict[str, str], values: dict[str, float | None] | None = None) -> str:
    """The captured body with the GPU's labels replaced and some field values overridden."""
    samples, headers = read_capture(DCGM)
    values = values or {}
    out = ["".join(headers.values())]
    for name, captured, value in samples:
        value = values.get(name, value)
        if value is not None:
            extra = {k: v for k, v in captured.items() if k in ("err_code", "err_msg")}
            out.append(exposition(name, {**labels, **extra}, value))
    return "".join(out)


@pytest.mark.parametrize(
    "spelling", ["gpu_operator", "hostname", "old_names", "exported", "no_pod"]
)
def test_every_label_spelling_gives_the_same_gpu(spelling):
    gpu = parse(body(variant(gpu_labels(), spelling))).gpus
    assert [(g.index, g.uuid, g.name, g.driver_version) for g in gpu] == [
        (0, UUID, "NVIDIA RTX 4000 Ada Generation", "580.95.05")
    ]
    assert gpu[0].utilization == 0.0
    assert gpu[0].memory_used_bytes == 1 * 2**20
    assert gpu[0].memory_total_bytes == (1 + 20015 + 457) * 2**20
    assert gpu[0].energy_joules == pytest.approx(455497.156)
    assert gpu[0].temperature_celsius == 48.0
    assert gpu[0].tensor_active == 0.0 and gpu[0].dram_active == 0.003074
    assert gpu[0].sm_active is None  # off in dcgm-exporter's default counters


def test_units_and_fallbacks():
    labels = gpu_labels()
    gpu = parse(body(labels, {"DCGM_FI_DEV_GPU_UTIL": 87.0})).gpus[0]
    assert gpu.utilization == pytest.approx(0.87)
    # Without GPU_UTIL (MIG-capable products, some DCGM builds): the graphics engine activity.
    gpu = parse(body(labels, {"DCGM_FI_DEV_GPU_UTIL": None})).gpus[0]
    assert gpu.utilization == 0.004656
    # Without FB_FREE the total is unknown, so is the ratio; without FB_RESERVED it counts 0.
    gpu = parse(body(labels, {"DCGM_FI_DEV_FB_FREE": None})).gpus[0]
    assert gpu.memory_used_bytes == 2**20 and gpu.memory_total_bytes is None
    assert gpu.memory_ratio() is None
    gpu = parse(body(labels, {"DCGM_FI_DEV_FB_RESERVED": None})).gpus[0]
    assert gpu.memory_total_bytes == 20016 * 2**20
    # gpu_uuid is the older spelling of UUID.
    old = {("gpu_uuid" if k == "UUID" else k): v for k, v in labels.items()}
    assert parse(body(old)).gpus[0].uuid == UUID


def test_two_gpus_and_mig_instances():
    first = gpu_labels()
    second = {**first, "gpu": "1", "UUID": "GPU-second"}
    text = body(first) + body(second, {"DCGM_FI_DEV_GPU_UTIL": 40.0})
    text += "".join(
        exposition("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, 0.5)
        for labels in mig_instances({**first, "gpu": "2", "UUID": "GPU-mig"}, ("1", "2"))
    )
    reading = parse(text)
    assert [(g.index, g.uuid, g.utilization) for g in reading.gpus] == [
        (0, UUID, 0.0),
        (1, "GPU-second", 0.4),
    ]
    assert reading.mig_lines == 2 and reading.complete


def test_damaged_lines_are_skipped_and_said_where_the_rest_is_used():
    labels = gpu_labels()
    good = body(labels, {"DCGM_FI_DEV_GPU_UTIL": 50.0})
    damaged = [
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="' + UUID + '"} forty',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="' + UUID + "} 48",
        'DCGM_FI_DEV_SM_CLOCK{gpu="zero",UUID="' + UUID + '"} 2310',
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-x"} NaN',
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-x"} -5',
        "DCGM_FI_DEV_GPU_UTIL",
    ]
    text = good + "\n".join(damaged) + "\n"
    reading = parse(text)
    assert not reading.complete and len(reading.skipped) == len(damaged)
    first = len(good.splitlines()) + 1
    assert reading.skipped[0] == f"line {first}: value 'forty' is not a number"
    assert "labels do not parse" in reading.skipped[1]
    assert "has no GPU index (gpu='zero')" in reading.skipped[2]
    assert "is nan" in reading.skipped[3] and "is -5.0" in reading.skipped[4]
    assert reading.skipped[5].endswith("not a sample line")
    # The good lines of GPU 0 still count, damaged or not elsewhere.
    assert [(g.index, g.utilization) for g in reading.gpus] == [(0, 0.5)]
    assert reading.gpus[0].power_watts == 40.979


def test_a_body_naming_thousands_of_gpus_is_cut_at_256():
    text = "".join(
        exposition("DCGM_FI_DEV_GPU_UTIL", {"gpu": str(i), "UUID": f"GPU-{i}"}, 50.0)
        for i in range(1000)
    )
    reading = parse(text)
    assert len(reading.gpus) == 256 and len(reading.skipped) == 744
    assert reading.skipped[0] == "line 257: more than 256 GPUs; GPU 256 left out"


def test_escaped_label_values_are_read():
    labels = {**gpu_labels(), "modelName": 'A "quoted"\\ model\nname'}
    assert parse(body(labels)).gpus[0].name == 'A "quoted"\\ model\nname'


def test_reads_the_latest_body_and_fails_when_dcgm_exporter_goes_silent():
    clock = [100.0]
    bodies = [body(gpu_labels(), {"DCGM_FI_DEV_GPU_UTIL": 30.0})]

    def fetch(url, timeout):
        if not bodies:
            raise FetchError("connection refused")
        return bodies[0]

    source = DcgmExporterSource(
        "http://127.0.0.1:9400/metrics", poll_interval=1.0, fetch=fetch, clock=lambda: clock[0]
    )
    source._thread = threading.current_thread()  # the test polls by hand: no fetch thread
    with pytest.raises(FetchError, match="no fetch has finished yet"):
        source.read(HostSample(0.0))
    source.poll_once()
    sample = HostSample(0.0)
    assert source.read(sample) is True and sample.gpus[0].utilization == 0.3
    bodies.clear()
    clock[0] += 9.0
    source.poll_once()  # refused: the last readings are still served, marked not fresh
    sample = HostSample(0.0)
    assert source.read(sample) is False and sample.gpus[0].utilization == 0.3
    clock[0] += 2.0
    with pytest.raises(FetchError, match="no answer for 11s .*connection refused"):
        source.read(HostSample(0.0))
    bodies.append(body(gpu_labels()))
    source.poll_once()
    assert source.read(HostSample(0.0)) is True


def test_the_fetch_thread_outlives_an_unexpected_error(caplog):
    calls = []

    def fetch(url, timeout):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a parser")
        return body(gpu_labels(), {"DCGM_FI_DEV_GPU_UTIL": 40.0})

    source = DcgmExporterSource("http://127.0.0.1:9400/metrics", poll_interval=0.05, fetch=fetch)
    try:
        with caplog.at_level(logging.WARNING, logger="trainprof.exporter"):
            with pytest.raises(FetchError):
                source.read(HostSample(0.0))  # the first fetch failed unexpectedly
            sample = HostSample(0.0)

            def read():
                try:
                    return source.read(sample)
                except FetchError:
                    return False

            wait_for(read, 5, "a reading after the error")
    finally:
        source.close()
    assert sample.gpus[0].utilization == 0.4
    assert "reading dcgm-exporter failed: RuntimeError: a bug in a parser" in caplog.text


@contextlib.contextmanager
def http_server(handler):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            handler(self)

        def log_message(self, *args):
            pass

    with _loopback(Handler, daemon_threads=True) as base:
        yield f"{base}/metrics"


def answer(request, status: int, text: bytes) -> None:
    request.send_response(status)
    request.send_header("Content-Length", str(len(text)))
    request.end_headers()
    request.wfile.write(text)


def test_basic_authentication_is_sent_and_the_password_never_logged(caplog):
    seen = []

    def handler(request):
        seen.append(request.headers.get("Authorization"))
        answer(request, 401, b"unauthorized")

    with http_server(handler) as url:
        url = url.replace("http://", "http://trainprof:s3cr%40t@")
        source = DcgmExporterSource(url, timeout=2.0)
        with caplog.at_level(logging.WARNING, logger="trainprof.exporter"):
            source.poll_once()
    assert seen == ["Basic " + base64.b64encode(b"trainprof:s3cr@t").decode()]
    assert "HTTP 401 Unauthorized" in caplog.text and "trainprof:***@" in caplog.text
    assert "s3cr" not in caplog.text


def test_an_http_proxy_in_the_environment_is_not_used(monkeypatch):
    # A proxy that does not exist: a request sent through it would fail.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    with http_server(lambda request: answer(request, 200, body(gpu_labels()).encode())) as url:
        assert parse(dcgm_exporter.http_fetch(url, 2.0)).gpus[0].uuid == UUID


def test_a_trickling_or_huge_body_is_cut_off():
    def trickle(request):
        request.send_response(200)
        request.send_header("Content-Length", "100000")
        request.end_headers()
        for _ in range(100):
            request.wfile.write(b"# x\n")
            request.wfile.flush()
            time.sleep(0.1)

    with http_server(trickle) as url:
        started = time.monotonic()
        with pytest.raises(FetchError, match="no complete answer within 1s"):
            dcgm_exporter.http_fetch(url, 1.0)
        assert time.monotonic() - started < 2.0

    with http_server(lambda request: answer(request, 200, b"#" * (9 * 2**20))) as url:
        with pytest.raises(FetchError, match="larger than 8 MiB"):
            dcgm_exporter.http_fetch(url, 5.0)

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(FetchError, match="refused"):
        dcgm_exporter.http_fetch(f"http://127.0.0.1:{port}/metrics", 1.0)


def test_a_redirect_to_another_host_gets_neither_the_password_nor_served(caplog):
    elsewhere_seen = []

    def elsewhere(request):
        elsewhere_seen.append(request.headers.get("Authorization"))
        answer(request, 200, body(gpu_labels()).encode())

    with http_server(elsewhere) as other:
        other_host = other.replace("127.0.0.1", "localhost")

        def redirect(request):
            request.send_response(302)
            request.send_header("Location", other_host)
            request.send_header("Content-Length", "0")
            request.end_headers()

        with http_server(redirect) as url:
            source = DcgmExporterSource(url.replace("http://", "http://trainprof:s3cr3t@"))
            with caplog.at_level(logging.WARNING, logger="trainprof.exporter"):
                source.poll_once()
            with pytest.raises(FetchError, match="redirected .HTTP 302. to another server"):
                source.read(HostSample(0.0))
    assert elsewhere_seen == [], "the credentials went to the other host"
    assert "to another server, http://localhost:" in caplog.text and "s3cr3t" not in caplog.text


def test_a_redirect_within_dcgm_exporter_is_followed_with_the_password():
    seen = []

    def handler(request):
        seen.append((request.path, request.headers.get("Authorization")))
        if request.path == "/metrics":
            request.send_response(301)
            request.send_header("Location", "/metrics/")
            request.send_header("Content-Length", "0")
            request.end_headers()
        else:
            answer(request, 200, body(gpu_labels()).encode())

    with http_server(handler) as url:
        fetched = dcgm_exporter.http_fetch(url.replace("http://", "http://u:pw-value@"), 2.0)
    assert parse(fetched).gpus[0].uuid == UUID
    basic = "Basic " + base64.b64encode(b"u:pw-value").decode()
    assert seen == [("/metrics", basic), ("/metrics/", basic)]


def test_headers_trickled_a_byte_at_a_time_are_cut_off():
    def trickle(request):
        request.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(100):
            request.wfile.write(b"x")
            request.wfile.flush()
            time.sleep(0.2)

    with http_server(trickle) as url:
        started = time.monotonic()
        with pytest.raises(FetchError, match="no complete answer within 1s"):
            dcgm_exporter.http_fetch(url, 1.0)
        assert time.monotonic() - started < 2.0


def test_a_silent_dcgm_exporter_never_holds_the_sampler():
    release = threading.Event()

    def silent(request):
        release.wait(10)

    with http_server(silent) as url:
        source = DcgmExporterSource(url, poll_interval=0.2, timeout=0.5)
        try:
            started = time.monotonic()
            with pytest.raises(FetchError, match="no complete answer within 0.5s"):
                source.read(HostSample(0.0))  # the priming read waits for the first fetch
            assert time.monotonic() - started < 2.0
            # Later reads never wait on the network.
            started = time.monotonic()
            for _ in range(50):
                with pytest.raises(FetchError):
                    source.read(HostSample(0.0))
            assert time.monotonic() - started < 0.5
        finally:
            release.set()
            source.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--collector.gpu.dcgm-exporter", "ftp://n1:9400/metrics"],
            "is not an http:// or https:// URL",
        ),
        (["--collector.gpu.dcgm-exporter", "http://n1:port/metrics"], "Port could not be cast"),
        (
            ["--collector.gpu.dcgm-exporter", "http://u:secret@n1:x/m"],
            "'http://u:***@n1:x/m'",
        ),
        (
            ["--collector.gpu.dcgm-exporter", "http://n1:9400/metrics", "--no-collector.gpu"],
            "the gpu collector is off",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args, message, capsys):
    assert main(["exporter", *args, "--web.listen-address", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "--collector.gpu.dcgm-exporter" in err and message in err
    assert "Traceback" not in err and "secret" not in err


def test_a_zero_poll_interval_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["exporter", "--collector.gpu.dcgm-exporter.poll-interval", "0s"])
    assert raised.value.code == 2 and "must be longer than 0s" in capsys.readouterr().err


RULES = {
    "datapoint_interval": "0.5s",
    "scrape_interval": "15s",
    "rules": [
        {
            "rule": "LowGPUUtilization",
            "parameters": {"window": 80, "patience": 10, "scan_interval_us": 1_000_000},
        },
        {"rule": "CPUBottleneck", "parameters": {"patience": 10, "scan_interval_us": 1_000_000}},
    ],
}


def test_rules_fire_on_a_real_prometheus_from_dcgm_exporter_readings(prometheus_bin, tmp_path):
    """Captured dcgm-exporter (GPU 0 at 2 %) -> the exporter -> Prometheus with the trainprof
    source's rules: the GPU is underutilized and the busy core makes it a CPU bottleneck."""
    labels = variant(gpu_labels(), "hostname")  # the newest exporter's spelling
    exporters = ScriptedExporters(
        {"n1": [labels]},
        gpu_script=lambda t, uuid: {"DCGM_FI_DEV_GPU_UTIL": 2.0},
        cpu_script=lambda t, host, cpu: (0.0, 0.0),
    )
    with serve(exporters) as address:
        exporter = trainprof.exporter.start(
            0,
            address="127.0.0.1",
            sources=[
                DcgmExporterSource(f"http://{address}/dcgm/n1", poll_interval=0.5),
                ScriptedCpu([([0.95, 0.2], [0.0, 0.0])]),
            ],
            identity={"training_job": "e2e", "node": "n1"},
            datapoint_interval=0.5,
        )
        rules = to_yaml({"groups": compile_rules(load_config(RULES)).groups})
        config = (
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "rule_files: [rules.yaml]\n"
            "scrape_configs:\n"
            "  - job_name: trainprof\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]\n"
        )
        try:
            with prometheus(prometheus_bin, tmp_path, config, {"rules.yaml": rules}) as base:

                def firing():
                    # one alert per rule; the GPU it found in its affected recording
                    result = query(base, 'ALERTS{alertstate="firing"}')["data"]["result"]
                    found = query(base, "gpu:trainprof_rule_low_gpu_utilization:affected")
                    uuids = {r["metric"].get("uuid") for r in found["data"]["result"]}
                    got = {
                        (
                            r["metric"]["alertname"],
                            ",".join(sorted(uuids)) if "reason" in r["metric"] else None,
                            r["metric"].get("reason"),
                        )
                        for r in result
                    }
                    return got if len(got) == 2 else None

                got = wait_for(firing, 150, "both alerts firing", step=1.0)
                info = query(base, "trainprof_gpu_info")["data"]["result"][0]["metric"]
                memory = query(
                    base, "trainprof_gpu_memory_used_bytes / trainprof_gpu_memory_total_bytes"
                )["data"]["result"]
        finally:
            exporter.stop()
    assert got == {
        ("TrainingLowGPUUtilization", UUID, "underutilized"),
        ("TrainingCPUBottleneck", None, None),
    }
    assert info["name"] == "NVIDIA RTX 4000 Ada Generation" and info["gpu"] == "0"
    assert float(memory[0]["value"][1]) == pytest.approx(1 / 20473)
