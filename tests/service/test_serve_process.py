"""`mtserve serve` as a process: health transitions, SIGTERM under load, start-up errors, and the
command-line client against it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.client import Client
from service.runtime.onnx_model import OnnxSeq2Seq
from tests.near_ties import assert_text_equal_up_to_a_near_tie, torch_next_log_probs
from tests.support import free_port, serve_command, wait_serving

LONG = "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen, die zuhören."


def start(onnx_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        serve_command(onnx_dir, f"127.0.0.1:{port}", "--metrics-port", "0", "--decode-workers", "1", *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def serving(tiny_onnx_dir):
    proc, address = start(tiny_onnx_dir)
    wait_serving(address, proc)
    yield address
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_sigterm_under_load_answers_every_accepted_request(tiny_onnx_dir):
    proc, address = start(tiny_onnx_dir, "--grace-period-s", "30")
    wait_serving(address, proc)
    outcomes = []
    first_answer = []

    def call(i):
        try:
            with Client(address, timeout=60) as c:
                if i % 4 == 3:  # a quarter are streams: a half-sent stream must be finished too
                    msgs = list(c.translate_stream(LONG, beam_size=1))
                    assert msgs[-1].HasField("final") and msgs[-1].final.text
                    r = [None, None]
                else:
                    r = c.translate([LONG, f"Ein Hund Nummer {i} rennt."], beam_size=4)
                first_answer.append(1)
                outcomes.append(("OK", len(r)))
        except grpc.RpcError as e:
            outcomes.append((e.code().name, e.details()))

    with ThreadPoolExecutor(32) as pool:
        futs = [pool.submit(call, i) for i in range(64)]
        while not first_answer:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        signalled = time.perf_counter()
        for f in futs:
            f.result()
    rc = proc.wait(60)
    exit_after = time.perf_counter() - signalled
    log = proc.stdout.read()
    assert exit_after < 30 + 5, exit_after  # within the grace period (plus process teardown)
    codes = [o[0] for o in outcomes]
    assert rc == 0, log
    assert len(outcomes) == 64
    # Accepted requests all got their answer; the others were refused as UNAVAILABLE, never lost.
    assert set(codes) <= {"OK", "UNAVAILABLE"}, outcomes
    assert codes.count("OK") >= 2
    assert all(n == 2 for code, n in outcomes if code == "OK")
    assert "drained" in log


def test_health_goes_not_serving_on_sigterm(tiny_onnx_dir):
    proc, address = start(tiny_onnx_dir, "--grace-period-s", "5")
    seen = wait_serving(address, proc)
    assert seen[-1] == "SERVING"
    with grpc.insecure_channel(address) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert proc.wait(30) == 0


def _rewrite_checksum(onnx_dir, path) -> None:
    """Make the manifest agree with a modified file, so that only the content is wrong."""
    import hashlib

    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    specs = [manifest["tokenizer"]] + [g for v in manifest["variants"].values() for g in (v["encoder"], v["decoder"])]
    for spec in specs:
        if spec["file"] == path.name:
            spec["sha256"] = digest
    (onnx_dir / "manifest.json").write_text(json.dumps(manifest))


STARTUP_PROBLEMS = {  # problem -> what the one error line must say
    "missing_dir": "manifest.json",
    "corrupt_graph": "checksum",  # a truncated graph: the manifest's checksum catches it
    "corrupt_graph_checksum_ok": "INVALID_PROTOBUF",  # truncated, manifest updated: ONNX Runtime catches it
    "manifest_checksum_mismatch": "checksum mismatch for",  # one flipped byte in the served encoder
    "wrong_tokenizer": "wrong tokenizer",  # another tokenizer, manifest updated to match it
    "cuda_strict": "CUDA execution provider requested but not available",
    "bad_setting": "max_batch_sentences",
}


@pytest.mark.parametrize("problem", list(STARTUP_PROBLEMS))
def test_startup_errors_exit_non_zero_with_one_clear_line(tiny_onnx_dir, tmp_path, problem):
    import shutil

    broken = tmp_path / "onnx"
    if problem not in ("missing_dir", "bad_setting", "cuda_strict"):
        shutil.copytree(tiny_onnx_dir, broken)
    if problem == "missing_dir":
        proc, _ = start(tmp_path / "nothing" / "onnx")
    elif problem in ("corrupt_graph", "corrupt_graph_checksum_ok"):
        graph = broken / "decoder.fused.int8.onnx"  # the default precision's default decoder step
        graph.write_bytes(graph.read_bytes()[:1000])
        if problem == "corrupt_graph_checksum_ok":
            _rewrite_checksum(broken, graph)
        proc, _ = start(broken)
    elif problem == "manifest_checksum_mismatch":
        graph = broken / "encoder.fused.int8.onnx"  # the default precision's (fused) encoder
        data = bytearray(graph.read_bytes())
        data[len(data) // 2] ^= 0xFF
        graph.write_bytes(bytes(data))
        proc, _ = start(broken)
    elif problem == "wrong_tokenizer":
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        other = Tokenizer(models.BPE(unk_token="<unk>"))
        other.pre_tokenizer = pre_tokenizers.ByteLevel()
        other.train_from_iterator(
            ["ein ganz anderer Text mit anderen Wörtern"] * 10,
            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "</s>", "<s>"]),
        )
        other.save(str(broken / "tokenizer.json"))
        _rewrite_checksum(broken, broken / "tokenizer.json")
        proc, _ = start(broken)
    elif problem == "cuda_strict":
        proc, _ = start(tiny_onnx_dir, "--provider", "cuda", "--strict-provider")
    else:
        proc, _ = start(tiny_onnx_dir, "--max-batch-sentences", "0")
    rc = proc.wait(60)
    out = proc.stdout.read()
    assert rc != 0
    assert "Traceback" not in out, out
    assert STARTUP_PROBLEMS[problem] in out, out
    if problem != "bad_setting":  # pydantic lists the offending fields on their own lines
        assert len([line for line in out.splitlines() if "cannot start" in line]) == 1, out


def test_cuda_asked_for_but_missing_falls_back_to_cpu_with_a_warning(tiny_onnx_dir):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here: there is no fallback to see")
    proc, address = start(tiny_onnx_dir, "--provider", "cuda", "--grace-period-s", "5")
    try:
        wait_serving(address, proc)
        with Client(address, timeout=30) as c:
            info = c.model_info()
            assert info.execution_provider == "cpu" and info.decoder_graph == "fused"  # the CPU's default
            assert c.translate(["Ein Hund."], beam_size=1)[0].text
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    out = proc.stdout.read()
    assert rc == 0
    assert any("WARNING" in line and "falling back to the CPU" in line for line in out.splitlines()), out


def test_sigkill_under_load_then_restart_serves(tiny_onnx_dir):
    """SIGKILL is not survivable for in-flight work, but it must not hang clients, and a new
    process on the same port serves at once."""
    proc, address = start(tiny_onnx_dir)
    wait_serving(address, proc)
    outcomes = []

    def call(i):
        try:
            with Client(address, timeout=30) as c:
                c.translate([LONG, f"Ein Hund Nummer {i} rennt."], beam_size=4)
                outcomes.append("OK")
        except grpc.RpcError as e:
            outcomes.append(e.code().name)

    with ThreadPoolExecutor(16) as pool:
        futs = [pool.submit(call, i) for i in range(32)]
        time.sleep(0.3)
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        for f in futs:
            f.result(timeout=60)  # every client got an answer: no hang
    assert len(outcomes) == 32 and set(outcomes) <= {"OK", "UNAVAILABLE"}, outcomes
    port = address.rsplit(":", 1)[1]
    again = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mtserve",
            "serve",
            "--model-dir",
            str(tiny_onnx_dir.parent),
            "--onnx-dir",
            str(tiny_onnx_dir),
            "--address",
            f"127.0.0.1:{port}",
            "--metrics-port",
            "0",
            "--decode-workers",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_serving(address, again)
        with Client(address, timeout=30) as c:
            assert c.translate([LONG], beam_size=1)[0].text
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(30) == 0


def test_cli_translate_texts_file_and_encode(serving, tmp_path, tiny_onnx_dir, tiny_model):
    cli = [sys.executable, "-m", "mtserve"]
    out = subprocess.run(
        [*cli, "translate", "--server", serving, "--beam", "1", "Ein Hund rennt durch den Schnee."],
        capture_output=True,
        text=True,
        check=True,
    )
    one = out.stdout.strip()
    assert one
    # The same lone request over the API, for its tokens: the same int8 step, the same text.
    with Client(serving, timeout=30) as c:
        (alone,) = c.translate(["Ein Hund rennt durch den Schnee."], beam_size=1, return_tokens=True)
    assert alone.text == one
    src = tmp_path / "de.txt"
    src.write_text("Ein Hund rennt durch den Schnee.\n\nZwei Männer sitzen auf einer Bank.\n" * 5)
    dst = tmp_path / "en.txt"
    subprocess.run(
        [
            *cli,
            "translate",
            "--server",
            serving,
            "--beam",
            "1",
            "--input",
            str(src),
            "--output",
            str(dst),
            "--concurrency",
            "4",
            "--batch-size",
            "2",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = dst.read_text().split("\n")[:-1]
    assert len(lines) == 15 and lines[1] == "" and all(lines[i] for i in (0, 2, 3, 5))
    # In order: line 0 is the sentence translated alone above. The server (int8 by default) may
    # have decoded it batched with the other requests' sentences: another int8 kernel (the batched
    # step, its activations quantised with theirs) than the lone request's one-row step, so equal
    # up to a near-tie in the fp32 reference (tests.near_ties), wherever that falls.
    model = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32")
    (src_ids,) = model.source_ids(["Ein Hund rennt durch den Schnee."])
    reference = torch_next_log_probs(tiny_model, src_ids)

    def detokenize(ids: list[int]) -> str:  # as the server writes a translation
        return model.detokenize([ids])[0]

    assert_text_equal_up_to_a_near_tie(lines[0], list(alone.token_ids), reference, model.eos_id, detokenize)
    enc = subprocess.run([*cli, "encode", "--server", serving, "Ein Hund."], capture_output=True, text=True, check=True)
    item = json.loads(enc.stdout)
    assert item["tokens"] and len(item["pooled"]) > 8
    bad = subprocess.run([*cli, "translate", "--server", serving, " "], capture_output=True, text=True)
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr
