"""What more than one test folder uses, in one place (tests import it as ``helpers``: the root
conftest puts tests/ on the path).

    oracle.py         content oracle and policy model for the op contract; index consistency
    plan_cases.py     Twin (kernels vs reference in lockstep), adversarial top-k, random sessions
    gather_cases.py   gather cases: pools, row formats, miss lists; kernel vs reference runners
    npu.py            why NPU tests skip here; compiling NPU host code against the stand-ins
    kernel_build.py   the strict_kernels marker and fixture of the runtime / integration tests
    engine.py         engine drivers of the runtime tests: tiny model, prompts, engine, run
    engine_harness.py a serving loop over the engine for the integration tests
    third_party.py    the third-party source trees (scripts/third_party.py): a skip naming the
                      missing tree and its folder in the cache, or a failure where CI requires it

``REPO`` is the repository root; ``SHARED`` the team's shared test inputs beside it (the traces in
``../shared/traces``, or ``AVSG_SHARED_DIR``), which tests skip without, saying so. Third-party
source trees are not there: they come from the cache, through ``third_party``.
"""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("AVSG_SHARED_DIR", os.path.join(os.path.dirname(REPO), "shared"))
