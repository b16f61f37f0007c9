// half_convert.cpp: the emulation's float <-> half conversions where the compiler targets F16C
// (emu_core.h: the hardware's) against the software path every other build uses. Built with
// -mf16c by tests/kernels/test_emulation_fast.py; prints the first mismatch, or OK.
#include "emu_core.h"

#include <cinttypes>
#include <cstdio>
#include <random>

#if !defined(__F16C__)
#error "build with -mf16c: this compares the F16C path with the software one"
#endif

using avsg_emu::numeric::f16_to_f32;
using avsg_emu::numeric::f16_to_f32_soft;
using avsg_emu::numeric::f32_to_f16;
using avsg_emu::numeric::f32_to_f16_soft;

static bool is_nan32(uint32_t x) { return (x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu); }

static bool check_float(uint32_t x) {
    if (is_nan32(x)) return true;   // the paths may differ in a NaN's payload only
    float f;
    std::memcpy(&f, &x, 4);
    const uint16_t hw = f32_to_f16(f), sw = f32_to_f16_soft(f);
    if (hw == sw) return true;
    std::printf("f32_to_f16(0x%08" PRIx32 "): hardware 0x%04x, software 0x%04x\n", x, hw, sw);
    return false;
}

int main() {
    for (uint32_t h = 0; h < 65536; ++h) {   // every half
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;
        const float hw = f16_to_f32(static_cast<uint16_t>(h)), sw = f16_to_f32_soft(static_cast<uint16_t>(h));
        if (std::memcmp(&hw, &sw, 4) != 0) {
            std::printf("f16_to_f32(0x%04x): hardware %a, software %a\n", h, hw, sw);
            return 1;
        }
    }
    // every float's upper 19 bits with the low 13 bits (what rounding to half drops) at the
    // rounding boundaries, then random floats
    const uint32_t lows[] = {0u, 1u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu};
    for (uint32_t hi = 0; hi < (1u << 19); ++hi)
        for (uint32_t lo : lows)
            if (!check_float((hi << 13) | lo)) return 1;
    std::mt19937 gen(7);
    for (int i = 0; i < 4000000; ++i)
        if (!check_float(static_cast<uint32_t>(gen()))) return 1;
    std::printf("OK\n");
    return 0;
}
