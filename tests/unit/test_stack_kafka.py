"""The dev stack's broker: its storage is formatted with a random cluster id on the
command line: one starting with "-" made `cronwheel up` fail one time in 64."""

from __future__ import annotations

import re
import shutil

import pytest

from cronwheel.stack.kafka import _cluster_id


def test_cluster_id__many_drawn__none_reads_as_an_option__all_kafka_shaped():
    ids = [_cluster_id() for _ in range(3000)]  # without the redraw ~47 would start with "-"
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_jvm_options__env_replaces_the_default__empty_keeps_it(monkeypatch):
    from cronwheel.stack.kafka import jvm_options

    monkeypatch.setenv("CRONWHEEL_KAFKA_JVM_OPTS", "-Xmx2g  -XX:+UseParallelGC")
    assert jvm_options() == ["-Xmx2g", "-XX:+UseParallelGC"]
    monkeypatch.setenv("CRONWHEEL_KAFKA_JVM_OPTS", " ")
    assert "-XX:+UseG1GC" in jvm_options()


@pytest.mark.skipif(
    shutil.which("javac") is None, reason="runs a Java source file: needs a JDK, as the stack does"
)
@pytest.mark.parametrize("collector", ["-XX:+UseG1GC", "-XX:+UseZGC"])
def test_gc_log_option__a_jvm_started_with_it_runs_and_logs_its_pauses__read_back(
    tmp_path, collector
):
    """The stack's broker starts with this option: a form the JVM refused
    (a quoting mistake) would fail every `cronwheel up`. A JVM whose only work
    is a full collection logs its pauses (ZGC's under another tag than
    G1's), and LocalKafka.gc_pauses reads them back within the wall clock of
    the run."""
    import subprocess
    import time

    from cronwheel.stack.kafka import LocalKafka, gc_log_option

    java = shutil.which("java")
    broker = LocalKafka(tmp_path / "a home")  # a space in the path, as a home may have
    broker.root.mkdir(parents=True)
    source = tmp_path / "Collect.java"
    source.write_text("class Collect { public static void main(String[] a) { System.gc(); } }")
    before = time.time() * 1000
    subprocess.run(
        [java, gc_log_option(broker.gc_log), collector, str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    after = time.time() * 1000
    pauses = broker.gc_pauses(before, after)
    assert pauses, broker.gc_log.read_text()
    assert all(before <= start <= after and length > 0 for start, length in pauses)
    assert broker.gc_pauses(after + 1000, after + 2000) == []


def test_gc_pauses__no_log__none(tmp_path):
    from cronwheel.stack.kafka import LocalKafka

    assert LocalKafka(tmp_path).gc_pauses(0, 1e15) is None


def test_gc_pause__a_pause_line_read__other_lines_not():
    from cronwheel.stack.kafka import gc_pause

    line = (
        "[2026-12-06T18:49:58.079+0000] GC(24) Pause Young (Normal) (G1 Evacuation Pause)"
        " 1397M->175M(2048M) 29.230ms"
    )
    start, length = gc_pause(line)
    assert length == pytest.approx(29.23)
    assert start == pytest.approx(1796582998079 - 29.23)
    assert gc_pause("[2026-12-06T18:49:58.079+0000] GC(3) Pause Mark Start 0.025ms")[1] == (
        pytest.approx(0.025)
    )
    assert gc_pause("[2026-12-06T18:49:58.079+0000] Using G1") is None
    assert (
        gc_pause("[2026-12-06T18:49:58.079+0000] GC(24)   Evacuate Collection Set: 23.0ms") is None
    )
    assert gc_pause("[2026-12-06T18:49:58.079+0000] GC(30) Garbage Collection (Proactive)") is None
