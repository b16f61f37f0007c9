"""The calibration microkernel (torch.ops.avsg.calibrate, op_kernel/calibrate_kernel.h) on the CPU
emulation: every mode's checksum against the Python golden (strict and fast builds), counted work
exactly linear in the iteration count with the expected API per iteration, argument checks, the
fake impl, the fits `avsg bench calibrate` applies to NPU timings, and `--emulate` from the CLI."""
from __future__ import annotations

import json
import os

import pytest
import torch

from avsg import _ops, backend, cli
from avsg.lab.commands.bench import calibrate
from avsg.lab.costmodel import hardware

VALUES = calibrate.microkernel_values()


@pytest.mark.parametrize("build", ["strict", "fast"])
@pytest.mark.parametrize("mode", calibrate.MODES)
def test_checksum_matches_golden(mode, build):
    with backend.emulation(build):
        for n in (1, 2, 5):
            out = torch.ops.avsg.calibrate(VALUES, mode, n)
            assert out.dtype == torch.int32 and out.shape == (_ops.CALIB_OUT_LEN,)
            assert torch.equal(out, calibrate.golden(VALUES, mode, n)), (mode, n)


def test_checksum_depends_on_every_iteration():
    for mode in ("scalar", "gather", "gathermask"):
        a, b = (torch.ops.avsg.calibrate(VALUES, mode, n) for n in (6, 7))
        assert not torch.equal(a[:2], b[:2]) or not torch.equal(a[8:], b[8:]), mode


def test_other_table_lengths_and_any_values():
    g = torch.Generator().manual_seed(3)
    for L in (2048, 8192):
        v = torch.randint(-2**31, 2**31 - 1, (L,), generator=g, dtype=torch.int64).to(torch.int32)
        for mode in ("scalar", "gather", "gathermask"):
            assert torch.equal(torch.ops.avsg.calibrate(v, mode, 3), calibrate.golden(v, mode, 3)), (L, mode)


# one iteration's counted work: (field or "API instrs", value); everything else per iteration is 0
EXPECTED = {
    "scalar": {"scalar_ub_reads": 1},
    "gather": {"vec_instrs": 1, "pipe_barriers": 1, "Gather instrs": 1,
               "vec_repeats": _ops.CALIB_GATHER_LANES * 4 // 256},
    "sort": {"vec_instrs": 1, "pipe_barriers": 1, "Sort instrs": 1},
    "gathermask": {"vec_instrs": 1, "pipe_barriers": 1, "GatherMask instrs": 1},
}


@pytest.mark.parametrize("mode", calibrate.MODES)
def test_counted_work_is_linear_in_iterations(mode):
    w = calibrate.emulated_work(mode, VALUES, iters=(3, 5, 11, 20))
    assert w["linear"] and w["checksum_ok"]
    per = w["per_iter"]
    for key, value in EXPECTED[mode].items():
        assert per.get(key) == value, (mode, key, per)
    # nothing else grows with n except the vector API's repeats
    extra = {k for k in per if k not in EXPECTED[mode] and not k.endswith(" repeats") and k != "vec_repeats"}
    assert not extra, (mode, extra)
    if mode != "scalar":
        assert per["vec_repeats"] > 0 and "scalar_ub_reads" not in per


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="mode"):
        torch.ops.avsg.calibrate(VALUES, "nope", 1)
    with pytest.raises(ValueError, match="iters"):
        torch.ops.avsg.calibrate(VALUES, "sort", 0)
    with pytest.raises(ValueError, match="power-of-two"):
        torch.ops.avsg.calibrate(VALUES[:3000], "sort", 1)
    with pytest.raises(ValueError, match="power-of-two"):
        torch.ops.avsg.calibrate(torch.zeros(16384, dtype=torch.int32), "sort", 1)
    with pytest.raises(TypeError, match="int32"):
        torch.ops.avsg.calibrate(VALUES.long(), "sort", 1)


def test_fake_impl_matches_the_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        out = torch.ops.avsg.calibrate(mode.from_tensor(VALUES), "gather", 4)
    assert out.shape == torch.ops.avsg.calibrate(VALUES, "gather", 1).shape and out.dtype == torch.int32


def test_fit_line_and_vector_fit_recover_known_constants():
    slope, icpt = calibrate.fit_line([1000, 2000, 4000], [5 + 0.02 * n for n in (1000, 2000, 4000)])
    assert slope == pytest.approx(0.02) and icpt == pytest.approx(5)
    rows = [dict(instrs=1, repeats=32, cycles=12 + 32 * 1.5), dict(instrs=1, repeats=16, cycles=12 + 16 * 1.5),
            dict(instrs=1, repeats=8, cycles=12 + 8 * 1.5)]
    fit = calibrate.fit_vector_constants(rows)
    assert fit["vec_issue_cycles"] == pytest.approx(12) and fit["vec_cycles_per_repeat"] == pytest.approx(1.5)
    # a negative unconstrained solution is replaced by the best one on an axis
    rows = [dict(instrs=1, repeats=32, cycles=10), dict(instrs=1, repeats=8, cycles=40)]
    fit = calibrate.fit_vector_constants(rows)
    assert fit["vec_issue_cycles"] >= 0 and fit["vec_cycles_per_repeat"] >= 0


def test_modelled_cycles_use_the_profile():
    hw = hardware.load_profile()
    per = {"scalar_ub_reads": 1}
    assert calibrate.modelled_cycles(per, hw)["scalar"] == hw["scalar_ub_cycles"]
    per = {"vec_instrs": 1, "vec_repeats": 32, "pipe_barriers": 1}
    c = calibrate.modelled_cycles(per, hw)
    assert c["vector"] == hw["vec_issue_cycles"] + 32 * hw["vec_cycles_per_repeat"]
    assert c["sync"] == hw["barrier_cycles"]


def test_cli_emulate_prints_counts_not_a_calibration(capsys, tmp_path):
    status = cli.main(["bench", "calibrate", "--emulate", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "COUNTS, NOT A CALIBRATION" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in calibrate.MODES}
    assert set(lines) == set(calibrate.MODES)
    assert all(" yes " in line and " ok " in line for line in lines.values()), out
    assert "Gather 1x32" in lines["gather"] and "Sort 1x" in lines["sort"] and "GatherMask 1x" in lines["gathermask"]
    data = json.load(open(os.path.join(tmp_path, "emulated_counts.json")))
    assert data["note"] == "counts, not a calibration" and [m["mode"] for m in data["modes"]] == list(calibrate.MODES)
    assert not os.path.exists(os.path.join(tmp_path, "profile.json"))


@pytest.mark.skipif(not _ops.npu_available(), reason="needs torch_npu and an Ascend NPU")
@pytest.mark.parametrize("mode", calibrate.MODES)
def test_npu_checksum_matches_golden(mode):   # never run: no NPU was available to this project
    backend.load_npu_backend()
    out = torch.ops.avsg.calibrate(VALUES.to("npu"), mode, 5).cpu()
    assert torch.equal(out, calibrate.golden(VALUES, mode, 5))


def test_profile_from_synthetic_timings_recovers_the_constants():
    """The NPU path's arithmetic, on CPU: timings made from known constants (plus a launch
    overhead) must give those constants back as 'measured' profile entries."""
    hw = hardware.load_profile()
    scalar, issue, per_repeat = 3.0, 12.0, 1.5
    reps = {"gather": 32, "sort": 32, "gathermask": 8}

    def cycles(mode):
        if mode == "scalar":
            return scalar
        return issue + reps[mode] * per_repeat + hw["barrier_cycles"]

    def time_us(values, mode, n):
        assert values.device.type == "cpu"
        return 4.0 + n * cycles(mode) / (hw["clock_ghz"] * 1e3)

    stamp = "measured by avsg bench calibrate on TestDevice 2026-01-01"
    micro = calibrate.microkernel_profile(hw, stamp, time_us, device="cpu",
                                          iters_by_mode={m: (2, 4, 8) for m in calibrate.MODES})
    e = micro["entries"]
    assert e["scalar_ub_cycles"]["value"] == pytest.approx(scalar)
    assert e["vec_issue_cycles"]["value"] == pytest.approx(issue)
    assert e["vec_cycles_per_repeat"]["value"] == pytest.approx(per_repeat)
    assert all(v["source"].startswith(stamp) for v in e.values())
    for mode, m in micro["modes"].items():
        assert m["checksum_ok"] and m["counts_linear"], mode
        assert m["intercept_us"] == pytest.approx(4.0)
        assert e[f"calib_{mode}_cycles_per_iter"]["value"] == pytest.approx(cycles(mode))
