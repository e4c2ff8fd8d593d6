"""cronwheel.core.ids: partitions are stable and in range, run ids are deterministic,
carry their partition, and never collide across namespaces."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronwheel.core.ids import (
    PARTITIONS,
    new_id,
    partition_of,
    partition_of_run,
    run_id_for_instant,
    run_id_for_node,
    run_id_for_trigger,
)

T = 1_800_000_000_000
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def test_partition_of__pinned_values__stable_across_releases():
    # Any service, in any language, must compute the same partition: pin it.
    for owner in ("job_0123456789abcdef0123", "wf_x", ""):
        digest = hashlib.sha256(owner.encode()).digest()
        assert partition_of(owner) == int.from_bytes(digest[:8], "big") % 1024
    assert [partition_of(o) for o in ("job_0123456789abcdef0123", "wf_x", "")] == [531, 268, 20]
    assert run_id_for_instant("job_a", T) == "2f496da7cb7e4962f08395dd8cfe6f3a"


@given(st.text())
def test_partition_of__any_owner__in_range(owner):
    assert 0 <= partition_of(owner) < PARTITIONS


def test_partition_of__many_owners__spread_over_partitions():
    used = {partition_of(f"job_{i}") for i in range(4096)}
    assert len(used) > PARTITIONS * 0.9


@given(st.text(min_size=1), st.integers(0, 2**50))
def test_run_ids__same_input__same_id_carrying_the_partition(job_id, at):
    rid = run_id_for_instant(job_id, at)
    assert rid == run_id_for_instant(job_id, at)
    assert RUN_ID.match(rid)
    assert partition_of_run(rid) == partition_of(job_id)
    tid = run_id_for_trigger(job_id, at)
    assert tid == run_id_for_trigger(job_id, at)
    assert partition_of_run(tid) == partition_of(job_id)


def test_run_id_for_instant__different_instants_or_jobs__different_ids():
    ids = {run_id_for_instant(j, T + k) for j in ("job_a", "job_b") for k in range(100)}
    assert len(ids) == 200


def test_run_id_for_node__lives_in_the_workflow_partition():
    rid = run_id_for_node("wf_1", "wfr_1", "extract")
    assert rid == run_id_for_node("wf_1", "wfr_1", "extract")
    assert partition_of_run(rid) == partition_of("wf_1")
    assert rid != run_id_for_node("wf_1", "wfr_2", "extract")
    assert rid != run_id_for_node("wf_1", "wfr_1", "load")


def test_run_ids__same_parts_in_other_namespaces__never_collide():
    job = "job_a"
    instant = run_id_for_instant(job, T)
    trigger = run_id_for_trigger(job, T)
    # A node whose ids spell the same parts as the job's instant.
    node = run_id_for_node(job, job, str(T))
    assert len({instant, trigger, node}) == 3
    assert partition_of_run(instant) == partition_of_run(trigger) == partition_of_run(node)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        "0" * 31,
        "0" * 33,
        "zz" + "0" * 30,  # not hex
        "400" + "0" * 29,  # partition 1024: out of range
        "fff" + "0" * 29,
    ],
)
def test_partition_of_run__not_a_run_id__value_error(bad):
    with pytest.raises(ValueError):
        partition_of_run(bad)


def test_new_id__prefixed_and_random():
    a, b = new_id("job"), new_id("job")
    assert re.match(r"^job_[0-9a-f]{20}$", a)
    assert a != b
