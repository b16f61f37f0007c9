"""`avsg doctor` on this machine (no CANN, no NPU): it names what is missing, self-tests the CPU
backend against the reference, ends with a one-line verdict and exits 0; user mistakes are one
line and exit 2 (python/avsg/cli_util.py). `scripts/build_npu.sh --test` runs it first on an
Ascend machine."""
import json
import os
import subprocess
import sys

import pytest

import avsg
from avsg.commands import doctor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args, env=None):
    e = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "avsg.cli", "doctor", *args], capture_output=True,
                          text=True, env=e, timeout=300)


def test_doctor_here_says_what_is_missing_and_exits_0(tmp_path):
    report = tmp_path / "doctor.json"
    res = run_cli("--seconds", "20", "--json", str(report),
                  env={"ASCEND_HOME_PATH": str(tmp_path / "no_cann"), "ASCEND_DRIVER_PATH": str(tmp_path)})
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1].startswith("verdict: CPU backend OK; NPU backend not available here")
    text = res.stdout
    for name in ("torch_npu", "CANN", "driver", "backend npu", "host registration", "adjacent rows npu",
                 "split lookup", "self-test npu"):
        assert any(name in line and "[--  ]" in line for line in lines), (name, text)
    assert any("self-test cpu" in line and "[ok  ]" in line and "exact" in line for line in lines), text
    assert any("adjacent rows cpu" in line and "[ok  ]" in line and "byte for byte" in line for line in lines), text
    data = json.loads(report.read_text())
    assert data["verdict"] == lines[-1] and {c["name"] for c in data["checks"]} >= {"torch", "self-test cpu"}


def test_doctor_reads_versions_from_the_install(tmp_path):
    cann = tmp_path / "cann"
    cann.mkdir()
    (cann / "ascend_toolkit_install.info").write_text("version=8.2.RC1\n")
    (tmp_path / "version.info").write_text("Version=24.1.rc2\n")
    res = run_cli("--no-selftest", env={"ASCEND_HOME_PATH": str(cann), "ASCEND_DRIVER_PATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "8.2.RC1" in res.stdout and "24.1.rc2" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--seconds", "0"], "argument --seconds: expected a finite number in (0, 86400], got 0"),
    (["--seconds", "nan"], "argument --seconds: expected a finite number in (0, 86400], got nan"),
    (["--json", "."], "--json: . is a directory, expected a file name"),
])
def test_doctor_usage_errors_are_one_line_exit_2(args, message):
    res = run_cli(*args)
    assert res.returncode == 2
    assert res.stderr.strip() == f"avsg doctor: error: {message}"


def test_verdict_names_what_failed():
    checks = [doctor.Check("torch", "ok", ""), doctor.Check("self-test npu", "fail", "step 3: slots differ")]
    assert doctor.verdict(checks).startswith("verdict: BROKEN: self-test npu failed")
    ok = [doctor.Check("self-test npu", "ok", "")]
    assert doctor.verdict(ok).startswith("verdict: NPU backend OK")


def test_build_script_without_cann_fails_clearly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_HOME_PATH"}
    env["HOME"] = str(tmp_path)
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_npu.sh"), "--test"],
                         capture_output=True, text=True, env=env, timeout=60)
    if os.path.isdir("/usr/local/Ascend"):
        pytest.skip("this machine has an Ascend install")
    assert res.returncode == 1 and "CANN not found" in res.stderr


def test_split_probe_reports_a_hang_and_a_failure_in_one_line_and_keeps_the_split_off(monkeypatch):
    """The split lookup's cross-core wait has no timeout: the doctor tries it in a child process
    with AVSG_NPU_SPLIT=1 and kills it after the limit. Here the child cannot load the NPU
    backend (its one line says so); a hang is simulated."""
    check = doctor.split_lookup_probe(120)
    assert check.status == "fail" and check.detail.startswith("stays off: the NPU backend is not loaded")
    assert "\n" not in check.detail

    def hang(*args, **kwargs):
        assert kwargs["env"]["AVSG_NPU_SPLIT"] == "1"
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])
    monkeypatch.setattr(subprocess, "run", hang)
    check = doctor.split_lookup_probe(7)
    assert check.status == "fail" and "did not finish in 7 s" in check.detail and "stays off" in check.detail


@pytest.mark.parametrize("launch", ["batch", "stub: no API", None])
def test_split_probe_keeps_the_split_off_in_every_build(monkeypatch, launch):
    """The batch schedule mode and launch timeout have not run on a card, so a library built with
    the config launch keeps the split off like any other: a failure says it stays off, a match
    recommends AVSG_NPU_SPLIT=1 (and names the batch mode when the library launches with it)."""
    def fails(*args, **kwargs):
        assert kwargs["env"]["AVSG_NPU_SPLIT"] == "1"
        return subprocess.CompletedProcess(args[0], 1, stdout="step 0: slots differs from the reference\n", stderr="")
    monkeypatch.setattr(subprocess, "run", fails)
    check = doctor.split_lookup_probe(9, launch)
    assert (check.status, check.detail) == ("fail", "stays off: step 0: slots differs from the reference")

    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])
    monkeypatch.setattr(subprocess, "run", hangs)
    check = doctor.split_lookup_probe(9, launch)
    assert check.status == "fail" and check.detail.startswith("stays off: the split plan did not finish in 9 s")
    assert "AVSG_NPU_SPLIT=0" not in check.detail

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a[0], 0, "", ""))
    mode = " (batch schedule mode)" if launch == "batch" else ""
    for env, tail in ((None, "turn it on with AVSG_NPU_SPLIT=1"), ("0", "turn it on with AVSG_NPU_SPLIT=1"),
                      ("1", "on (AVSG_NPU_SPLIT=1)")):
        if env is None:
            monkeypatch.delenv("AVSG_NPU_SPLIT", raising=False)
        else:
            monkeypatch.setenv("AVSG_NPU_SPLIT", env)
        check = doctor.split_lookup_probe(9, launch)
        assert (check.status, check.detail) == ("ok", f"a split plan{mode} and a plan_gather matched the reference "
                                                      f"on this device; {tail}")


def _planted(real, rows, plant):
    """``real`` (a reference function), except that on a call of ``rows`` rows ``plant(args,
    out)`` changes what it wrote or returns: a difference the probe must name."""
    def planted(*args, **kwargs):
        out = real(*args, **kwargs)
        if args[0].shape[0] == rows:
            plant(args, out)
        return out
    return planted


def test_plan_gather_probe_is_exact_here_and_names_a_difference(monkeypatch):
    """The child's plan_gather probe (run on the NPU there) on the CPU emulation, with the lookup
    split and without: exact, its three sessions (2 rows, whose own cores look up no chunk with
    the split; cores // 3 rows, whose own cores look up chunks too; more rows than cores, with
    idle rows and an idle row's drop). A reference that copies one byte differently is
    reported, in one line naming the session and what differs, in any session."""
    from avsg.buffer import lookup_split
    from helpers.plan_cases import split_lookup
    cores = avsg.get_num_cores()
    assert lookup_split(cores, 2, 2 * 512, 2048) == 2 * 512 // 512 + 1
    assert 2 <= lookup_split(cores, cores // 3, 2 * 1024, 2048) <= 2 * 1024 // 512 - 1
    assert doctor.plan_gather_probe("cpu") is None
    with split_lookup():                  # the child's AVSG_NPU_SPLIT=1: the lookup split too
        assert doctor.plan_gather_probe("cpu") is None
    from avsg import reference
    real = reference.plan_gather

    def off_by_one(rows):             # the last byte the reference copies to its dst
        return _planted(real, rows, lambda args, out: args[7][0].view(-1)[-1:].bitwise_xor_(1))
    for rows in (2, cores // 3, cores + 3):
        monkeypatch.setattr(reference, "plan_gather", off_by_one(rows))
        assert doctor.plan_gather_probe("cpu") == (f"plan_gather ({rows} rows) step 0: copied "
                                                   f"bytes differ from the reference")


def test_split_plan_probe_covers_both_splits_and_names_a_difference(monkeypatch):
    """The child's split plan probe (run on the NPU there) on the CPU emulation with the lookup
    split: exact in both sessions, one whose row takes a core per chunk and one more (its own
    core looks up none) and one where every row's own core looks up a chunk
    (buffer.lookup_split). A reference that differs is reported in one line naming the session
    and what differs."""
    from avsg import reference
    from avsg.buffer import lookup_split
    from helpers.plan_cases import split_lookup
    cores = avsg.get_num_cores()
    chunks = 2 * 2048 // 512
    assert lookup_split(cores, 1, 2 * 2048, 8192) == chunks + 1
    assert 2 <= lookup_split(cores, cores // 4, 2048, 8192) <= 2048 // 512
    with split_lookup():
        assert doctor.split_plan_probe("cpu") is None
        real = reference.plan

        def off_by_one(rows):         # the first row's miss count
            return _planted(real, rows, lambda args, out: out[3][:1].add_(1))
        for rows, session in ((1, "1 row of 2"), (cores // 4, f"{cores // 4} rows of 1")):
            monkeypatch.setattr(reference, "plan", off_by_one(rows))
            assert doctor.split_plan_probe("cpu") == (f"split plan ({session} x top-2048) step 0: "
                                                      f"miss_counts differs from the reference")


def test_split_launch_note_names_the_launch_once(monkeypatch):
    monkeypatch.delenv("AVSG_NPU_SPLIT_TIMEOUT", raising=False)
    assert doctor.split_launch_note("batch") == ("split plan launch: batch schedule mode, timeout 30 s "
                                                 "(AVSG_NPU_SPLIT_TIMEOUT); the split is off unless AVSG_NPU_SPLIT=1")
    monkeypatch.setenv("AVSG_NPU_SPLIT_TIMEOUT", "120")
    assert "timeout 120 s" in doctor.split_launch_note("batch")
    note = doctor.split_launch_note("stub: the acl/acl_rt.h of CANN lacks X")
    assert note == ("split plan launch: ACLRT_LAUNCH_KERNEL, no batch schedule mode (the acl/acl_rt.h of CANN lacks X); "
                    "the split is off unless AVSG_NPU_SPLIT=1")
    assert "off unless AVSG_NPU_SPLIT=1" in doctor.split_launch_note(None)


def test_adjacent_rows_probe_reads_runs_of_odd_rows_and_matches_the_reference():
    """The first-contact check for DataCopyPad's UB padding: runs of adjacent 656 B rows (not a
    multiple of 32 B) over several cores. On CPU it runs the kernel through the emulation, which
    places and reads UB rows by the documented rule; the counters show the runs were read as
    multi-row copies (what the check is about), not row by row."""
    import torch
    from avsg import backend
    host, miss_pos, miss_slots, miss_counts, S = doctor.adjacent_rows_case()
    assert host.shape[-1] % 32 != 0
    assert torch.equal(miss_pos.diff(dim=1), torch.ones_like(miss_pos[:, 1:]))   # adjacent host rows
    check = doctor.adjacent_rows_probe("cpu")
    assert (check.name, check.status) == ("adjacent rows cpu", "ok"), check.detail
    c = backend.last_launch_counters()
    assert c.blocks == doctor.ADJACENT_CORES
    share = host.shape[0] * doctor.ADJACENT_RUN // doctor.ADJACENT_CORES
    # tiling, counts, two index loads and the row reads: 80 rows in three reads per core
    assert c["mte2_copies"].tolist() == [4 + 3] * doctor.ADJACENT_CORES, c["mte2_copies"].tolist()
    assert int(c["mte2_copies"].max()) < share // 8


def test_adjacent_rows_probe_names_rows_at_the_wrong_pitch():
    """A device that put the rows after the first of a multi-row read at another UB offset: the
    check fails, names the first wrong slot and says the first row of each core's share was right.
    Stand-in: the real op, then every row that is not the first of its read shifted by 16 B."""
    import torch

    def shifted(miss_pos, miss_slots, counts, src, dst, *rest):
        out = torch.ops.avsg.gather(miss_pos, miss_slots, counts, src, dst, *rest)
        for r in range(miss_pos.shape[0]):
            for j in range(miss_pos.shape[1]):
                if j % 80 % 32:   # reads of 32, 32 and 16 rows per core's share: 6 heads per row, 308 others
                    row = dst[0][r, int(miss_slots[r, j])]
                    row.copy_(torch.roll(row.clone(), 16))
        return out
    check = doctor.adjacent_rows_probe("cpu", shifted)
    assert check.status == "fail"
    assert check.detail.startswith("308 of 320 gathered 656 B rows differ from the reference, first at row 0 slot 1 "
                                   "(pos 8); the first row of each core's share is right"), check.detail

    def first_row_wrong(miss_pos, miss_slots, counts, src, dst, *rest):
        out = torch.ops.avsg.gather(miss_pos, miss_slots, counts, src, dst, *rest)
        dst[0][1, int(miss_slots[1, 0]), 0] ^= 1
        return out
    check = doctor.adjacent_rows_probe("cpu", first_row_wrong)
    assert check.status == "fail" and check.detail == ("1 of 320 gathered 656 B rows differ from the reference, "
                                                       "first at row 1 slot 191 (pos 120)")
