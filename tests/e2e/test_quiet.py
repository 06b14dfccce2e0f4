"""Safe models certified and their unsafe twins refused, through ``qlint --format json`` (fixtures/quiet.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

EXPECTED = {  # factory: (verdict, max q)
    "elu_written_out": ("certified", 1.0),
    "huber_written_out": ("certified", 1.0),
    "elu_wrong_side": ("supercritical", None),  # exp(h) for h > 0: faster than any power
    "huber_outside": ("supercritical", 2.0),
    "huber_learned_threshold": ("certified", 1.0),
    "huber_learned_one_side": ("supercritical", 2.0),
    "huber_input_threshold": ("supercritical", 2.0),
    "selected_through_a_matmul": ("supercritical", 2.0),
    "cube_on_an_interval": ("certified", 0.0),  # a soft clip: the velocity is bounded
    "cube_on_a_ray": ("supercritical", 3.0),
    "cube_on_two_values": ("supercritical", 3.0),
    "softplus_threshold_written_out": ("certified", 1.0),  # 2h > 20 compares h with 10
    "cube_on_a_scaled_ray": ("supercritical", 3.0),
    "smooth_l1_ratio": ("certified", 1.0),  # the where's other branch is read where |h| >= 1
    "square_of_the_tail": ("supercritical", 2.0),
    "straight_through": ("certified", 1.0),
    "half_cancelled": ("supercritical", 2.0),
    "direction_times_linear": ("certified", 1.0),
    "direction_times_square": ("supercritical", 2.0),
    "rotation_by_data_angles": ("certified", 1.0),
    "rotation_with_an_offset": ("certified", 1.0),
    "rotation_with_a_real_part": ("supercritical", None),
    "edge_softmax": ("certified", 1.0),
    "edge_softmax_shifted_by_another_node": ("uncertified", None),  # exp(s - max) unbounded, then divided
    "edge_softmax_summed_onto_a_learned_base": ("uncertified", None),  # base + sum may cross 0
    "edge_softmax_summed_onto_ones": ("certified", 1.0),
    "custom_op_function": ("certified", 1.0),
    "custom_op_decomposed_square": ("supercritical", 2.0),
    "custom_op_with_its_own_kernel": ("uncertified", None),  # the CPU kernel is not the function qlint can read
    "relative_position_buckets": ("certified", 1.0),
    "relative_position_log_unselected": ("uncertified", None),  # log(0) of a size-only offset reaches the output
    "sparse_adjacency": ("certified", 1.0),  # a sparse buffer is compared and read by its dense values
    "sparse_adjacency_squared": ("supercritical", 2.0),
    "response_normalisation": ("certified", 1.0),  # g / mean(g) of a non-negative g lies in [0, n]
    "signed_mean_ratio": ("uncertified", None),  # a mean of signed entries may cross 0
    "softmax_one": ("certified", 1.0),
    "softmax_one_capped": ("supercritical", None),  # exp(s - min(max s, 0)): faster than any power
    "edge_softmax_index_add": ("certified", 1.0),
    "edge_softmax_read_at_source": ("uncertified", None),  # the sum read back in another group
    "edge_softmax_global_shift": ("certified", 1.0),  # s - s.max(): one maximum is >= every group's entries
    "edge_softmax_partial_shift": ("uncertified", None),  # the maximum of some edges only
    "top_k_scale": ("certified", 1.0),  # h / mean of the 3 largest |h|: in [-3, 3]
    "top_k_scale_of_the_smallest": ("uncertified", None),  # the 3 smallest |h| may be 0
    "top_k_scale_of_another_value": ("uncertified", None),  # the largest |u| say nothing of h
    "overflow_penalty": ("certified", 0.0),  # u * u * relu(p - 1): a factor exactly 0
    "overflow_penalty_open": ("supercritical", 2.0),  # relu(p - 0.5) opens
    "overflow_penalty_of_exp": ("supercritical", None),  # exp(u) * 0 is NaN where exp(u) overflows
}


@pytest.fixture(scope="module")
def report() -> dict[str, dict]:
    specs = [f"fixtures/quiet.py:{name}" for name in EXPECTED]
    proc = subprocess.run([sys.executable, "-m", "qlint", *specs, "--format", "json", "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    return {m["spec"].split(":")[-1]: m for m in json.loads(proc.stdout)["models"]}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_verdict_and_max_q(report, name):
    assert (report[name]["verdict"], report[name]["max_q"]) == EXPECTED[name]


def test_the_witness_measured_what_was_certified(report):
    for name, (verdict, _) in EXPECTED.items():
        if verdict == "certified":
            assert "none refuted" in report[name]["witness"], name
