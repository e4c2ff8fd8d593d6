"""The dev stack's broker: its storage is formatted with a random cluster id on the
command line: one starting with "-" made `cronwheel up` fail one time in 64."""

from __future__ import annotations

import re

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
