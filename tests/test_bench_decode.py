"""The decode projection: the link bounds every modelled gather, and ``avsg bench decode`` runs."""
import json

import pytest

from avsg import cli
from avsg.bench import hardware
from avsg.traces import synth
from avsg.traces.format import save_trace


def test_link_time_never_beats_the_link():
    hw = hardware.load_profile()
    for rows in (1, 100, 10_000, 1_000_000):
        for row_bytes in (656, 1152):
            t = hardware.link_time_s(hw, rows, row_bytes)
            assert t >= rows * row_bytes / hw["link_bytes_per_s"]
            assert t >= rows * hw["host_dma_latency_s"] / (hw["aiv_cores"] * hw["dma_in_flight_per_core"])


def test_profile_entries_name_their_source():
    hw = hardware.load_profile()
    for key, source in hw.sources().items():
        assert source, key


def test_bench_decode_runs_and_avsg_copies_less(tmp_path):
    trace = tmp_path / "t.npz"
    save_trace(trace, synth.generate(steps=48, layers=1, k=2048, max_len=6000, seed=0))
    out = tmp_path / "decode.json"
    status = cli.main(["bench", "decode", "--trace", str(trace), "--trace-steps", "40",
                       "--trace-layers", "1", "--batch", "1,16", "--context", "32768",
                       "--mtp", "0,1", "--json", str(out), "--out", str(tmp_path)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["estimate"] is True
    for row in result["results"]:
        modes = row["modes"]
        assert modes["device"]["h2d_bytes_per_token"] == 0
        assert modes["avsg"]["h2d_bytes_per_token"] < modes["offload"]["h2d_bytes_per_token"]
        assert modes["device"]["tpot_s"] <= modes["offload"]["tpot_s"]


@pytest.mark.parametrize("args", [["--batch", "0"], ["--mtp", "5"], ["--cards", "0"],
                                  ["--hw", "/no/such.json"], ["--link-gbps", "-1"]])
def test_bench_decode_bad_input_exit_2(args, capsys):
    try:
        status = cli.main(["bench", "decode", *args])
    except SystemExit as e:         # a range the argument parser checks
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and args[0] in err[0]
