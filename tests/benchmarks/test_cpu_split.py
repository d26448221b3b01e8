"""benchmarks/cpu_split.py: the split of thread CPU time into roles, and a measurement against a
real two-replica server on loopback."""

from __future__ import annotations

import argparse
import os
import threading

from benchmarks.cpu_split import measure, split, thread_cpu_s


def test_split_names_the_main_thread_the_loop_and_the_busiest_the_workers():
    before = {10: {10: 1.0, 11: 0.5, 12: 0.1, 13: 0.0}, 20: {20: 0.0, 21: 0.0}}
    after = {
        10: {10: 2.0, 11: 3.5, 12: 0.3, 13: 1.0, 14: 0.2},  # 14 started between the snapshots
        20: {20: 0.5, 21: 2.0},
    }
    roles = split(before, after, workers=1)
    assert roles == {"event_loop": 1.5, "decode_workers": 5.0, "other_threads": 0.2 + 1.0 + 0.2}
    two = split(before, after, workers=2)
    assert two["decode_workers"] == 3.0 + 1.0 + 2.0 and two["event_loop"] == 1.5


def test_thread_cpu_s_sees_a_busy_thread_of_this_process():
    done = threading.Event()
    ident: list[int] = []

    def spin():
        ident.append(threading.get_native_id())
        x = 0
        while not done.is_set():
            x += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        threading.Event().wait(0.3)
        cpu = thread_cpu_s(os.getpid())
    finally:
        done.set()
        t.join()
    assert os.getpid() in cpu and cpu[ident[0]] > 0.05


def test_measure_splits_a_replicated_servers_cpu(tiny_onnx_dir, test_split):
    args = argparse.Namespace(
        model=str(tiny_onnx_dir.parent),  # the model dir, its export in onnx/
        backend="ort",
        server_arg=["--replicas", "2", "--decode-workers", "1"],
        workers=1,
        beam=1,
        concurrency=8,
        connections=4,
        requests=96,
    )
    result = measure(args, test_split[0][:40], test_split[1][:40])
    assert result["errors"] == {} and result["serving_processes"] == 2
    per = result["cpu_ms_per_request"]
    assert per["event_loop"] > 0 and per["decode_workers"] > 0 and per["load_generator"] > 0
    assert abs(sum(per.values()) - result["cpu_ms_per_request_total"]) < 0.01
