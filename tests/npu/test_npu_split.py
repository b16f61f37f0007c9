"""The plan's split lookup on an Ascend NPU: a split plan against the reference, in a child
process killed after a time limit (avsg doctor's probe), so that a cross-core wait that never
completes fails this test instead of hanging the run. The split is off on an NPU in every build;
this is what AVSG_NPU_SPLIT=1 would turn on, launched as the build launches it (with the config
launch: batch schedule mode and a timeout, docs/npu.md section 1b). Skips, saying why, without
torch_npu, a visible NPU or the NPU backend."""
from __future__ import annotations

import pytest

from avsg import backend
from avsg.commands import doctor

from helpers.npu import npu_skip_reason

pytestmark = pytest.mark.npu
SKIP_REASON = npu_skip_reason()
if SKIP_REASON:
    pytest.skip(SKIP_REASON, allow_module_level=True)


def test_split_plan_matches_the_reference_within_a_time_limit():
    launch = backend.backend_info()["npu_split_launch"]
    check = doctor.split_lookup_probe(120, launch)
    assert check.status == "ok", f"{doctor.split_launch_note(launch)}: {check.detail}"
