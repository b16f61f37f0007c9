"""The host-register path of the NPU backend, without an NPU: op_host/npu/host_register.cpp needs
no SDK header, so it is compiled here with a small driver and run against fake runtime and driver
libraries (some missing the symbols), and host_pool.cpp is compiled against the SDK stand-ins to
show the library no longer links aclrtHostRegister / aclrtHostUnregister directly, so a runtime
without them cannot stop it from loading.

What this cannot show: that a real CANN runtime or driver maps host memory for the AI cores.
`avsg doctor` on an Ascend machine does (tests/npu/test_npu*.py too).
"""
import os
import shutil
import subprocess

import pytest

from helpers.npu import compile_npu_unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None,
                                reason="needs g++ and nm")

FAKE_ACL = r'''
#include <cstdint>
#include <cstdlib>
extern "C" int aclrtHostRegister(void* p, uint64_t n, int type, void** dev) {
    if (getenv("FAKE_ACL_FAIL")) return 107000;
    *dev = (char*)p + 0x100000; return 0; }
extern "C" int aclrtHostUnregister(void*) { return 0; }
'''
FAKE_ACL_WITHOUT = r'''
extern "C" int aclrtGetDevice(int* d) { *d = 0; return 0; }
'''
FAKE_HAL = r'''
#include <cstdint>
extern "C" int halHostRegister(void* p, uint64_t n, uint32_t flag, uint32_t dev, void** out) {
    if (flag != 0) return 1;  // HOST_MEM_MAP_DEV
    *out = (char*)p + 0x200000 + dev; return 0; }
extern "C" int halHostUnregister(void*, uint32_t) { return 0; }
extern "C" int halGetAPIVersion(int* v) { *v = 0x071905; return 0; }
'''
DRIVER = r'''
#include "npu/host_register.h"
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
using namespace avsg::npu;
int main(int argc, char** argv) {
    HostRegisterApi api(DlsymLookup, ReadStackVersions(), argc > 3 ? argv[3] : "auto", argv[1], argv[2]);
    std::printf("PREFERRED %s\nDESCRIBE %s\n", PathName(api.preferred()), api.Describe().c_str());
    alignas(4096) static char pool[8192];
    HostRegisterPath used = HostRegisterPath::kNone;
    try {
        void* dev = api.Register(pool, RoundUpToPage(5000), 3, &used);
        std::printf("USED %s OFFSET 0x%lx\n", PathName(used), (unsigned long)((char*)dev - pool));
        std::printf("UNREGISTER %d\n", api.Unregister(pool, 3, used));
    } catch (const std::runtime_error& e) {
        std::printf("ERROR %s\n", e.what());
    }
    std::printf("ROUND %lu %lu\n", (unsigned long)RoundUpToPage(1), (unsigned long)RoundUpToPage(8192));
    return 0;
}
'''


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostreg")
    libs = {}
    for name, src in (("acl", FAKE_ACL), ("acl_without", FAKE_ACL_WITHOUT), ("hal", FAKE_HAL)):
        (d / f"{name}.cpp").write_text(src)
        libs[name] = str(d / f"lib{name}.so")
        subprocess.run(["g++", "-shared", "-fPIC", "-o", libs[name], str(d / f"{name}.cpp")], check=True)
    (d / "driver.cpp").write_text(DRIVER)
    exe = str(d / "driver")
    res = subprocess.run(["g++", "-std=c++17", f"-I{ROOT}/op_host", "-o", exe, str(d / "driver.cpp"),
                          os.path.join(ROOT, "op_host/npu/host_register.cpp"), "-ldl"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    # a CANN and a driver install with only their version files
    for cann, version in (("cann82", "8.2.RC1"), ("cann91", "9.1.0")):
        (d / cann).mkdir()
        (d / cann / "ascend_toolkit_install.info").write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\n")
    (d / "driver_install").mkdir()
    (d / "driver_install" / "version.info").write_text("Version=24.1.rc2\n")
    return d, exe, libs


def run(fakes, acl, hal, cann="cann91", forced="auto", **env):
    d, exe, libs = fakes
    e = dict(os.environ, ASCEND_HOME_PATH=str(d / cann), ASCEND_DRIVER_PATH=str(d / "driver_install"), **env)
    res = subprocess.run([exe, libs.get(acl, "libnone_such.so"), libs.get(hal, "libnone_such.so"), forced],
                         capture_output=True, text=True, env=e, timeout=30)
    assert res.returncode == 0, res.stderr
    return dict(line.split(" ", 1) for line in res.stdout.splitlines())


def test_recent_cann_uses_the_runtime_call(fakes):
    out = run(fakes, "acl", "hal", cann="cann91")
    assert out["PREFERRED"] == "aclrtHostRegister" and out["USED"].startswith("aclrtHostRegister OFFSET 0x100000")
    assert "CANN 9.1.0" in out["DESCRIBE"] and "driver 24.1.rc2" in out["DESCRIBE"]
    assert out["UNREGISTER"] == "0"


def test_older_cann_falls_back_to_the_driver_call(fakes):
    out = run(fakes, "acl", "hal", cann="cann82")
    assert out["PREFERRED"] == "halHostRegister" and "predates" in out["DESCRIBE"]
    assert out["USED"] == "halHostRegister OFFSET 0x200003"   # the driver got the device id
    assert "HAL API 0x71905" in out["DESCRIBE"]


def test_runtime_without_the_symbol_uses_the_driver_call(fakes):
    out = run(fakes, "acl_without", "hal", cann="cann91")
    assert out["PREFERRED"] == "halHostRegister" and "missing" in out["DESCRIBE"]
    assert out["USED"].startswith("halHostRegister")


def test_a_failing_runtime_call_falls_back(fakes):
    out = run(fakes, "acl", "hal", cann="cann91", FAKE_ACL_FAIL="1")
    assert out["USED"].startswith("halHostRegister")


def test_neither_call_is_one_clear_error_naming_the_versions(fakes):
    out = run(fakes, "acl_without", "missing")
    assert "USED" not in out
    err = out["ERROR"]
    assert "aclrtHostRegister" in err and "halHostRegister" in err and "missing" in err
    assert "CANN 9.1.0" in err and "driver 24.1.rc2" in err


def test_forced_path(fakes):
    out = run(fakes, "acl", "hal", cann="cann91", forced="hal")
    assert out["PREFERRED"] == "halHostRegister" and "forced" in out["DESCRIBE"]
    out = run(fakes, "acl_without", "hal", forced="acl")
    assert out["USED"].startswith("halHostRegister")   # forced but missing: the other one


def test_sizes_round_to_whole_pages(fakes):
    assert run(fakes, "acl", "hal")["ROUND"] == "4096 8192"


def test_npu_library_does_not_link_the_register_symbols(tmp_path):
    """host_pool.cpp compiled as the NPU library compiles it: no undefined reference to the
    host-register calls (they are looked up with dlsym), so a runtime without them still loads
    the library, plan included."""
    for unit in ("op_host/npu/host_pool.cpp", "op_host/npu/host_register.cpp"):
        obj = tmp_path / (os.path.basename(unit) + ".o")
        res = compile_npu_unit(unit, "-c", "-fPIC", "-o", str(obj))
        assert res.returncode == 0, res.stderr[-3000:]
        undefined = subprocess.run(["nm", "-u", "-C", str(obj)], capture_output=True, text=True).stdout
        for symbol in ("aclrtHostRegister", "aclrtHostUnregister", "halHostRegister", "halHostUnregister"):
            assert symbol not in undefined, f"{unit} links {symbol} directly"


def test_alloc_host_pool_without_the_npu_backend_is_page_aligned():
    import torch
    from avsg import backend
    if backend.backend_info()["npu_loaded"]:
        pytest.skip("the NPU backend allocates with aclrtMallocHost (tests/npu/test_npu.py)")
    pool = backend.alloc_host_pool((3, 5, 7), torch.bfloat16)
    assert pool.shape == (3, 5, 7) and pool.dtype == torch.bfloat16 and pool.is_contiguous()
    assert pool.data_ptr() % 4096 == 0
    pool.fill_(1.5)
    assert bool((pool == 1.5).all())
    with pytest.raises(ValueError, match="shape"):
        backend.alloc_host_pool((2, -1), torch.uint8)
