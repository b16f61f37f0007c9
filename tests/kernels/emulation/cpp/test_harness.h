// Minimal harness for the emulation tests: named cases, CHECK macros.
// Exit codes: 0 = OK, 2 = CHECK failed, 3 = AscendC::EmuError escaped (message printed),
// 4 = other exception, 5 = unknown case.
#pragma once
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include "kernel_operator.h"

struct CheckFailed : std::logic_error {
    using std::logic_error::logic_error;
};
struct CaseEntry {
    std::function<void()> fn;
    bool hazards = true;  // run with the pipe-hazard scoreboard on (the default)
};
inline std::map<std::string, CaseEntry>& registry() {
    static std::map<std::string, CaseEntry> r;
    return r;
}
struct Registrar {
    Registrar(const char* n, std::function<void()> f, bool hazards) { registry()[n] = CaseEntry{std::move(f), hazards}; }
};
// CASE: runs strict (scoreboard on). CASE_UNSYNCED: a mini-kernel that tests another rule and
// omits the SetFlag/WaitFlag/PipeBarrier a real kernel needs; it runs with the scoreboard off
// (avsg_emu::set_hazard_checks(false), the emulation tests' escape hatch).
#define CASE_IMPL(name, hz)                             \
    static void case_##name();                          \
    static Registrar reg_##name(#name, case_##name, hz); \
    static void case_##name()
#define CASE(name) CASE_IMPL(name, true)
#define CASE_UNSYNCED(name) CASE_IMPL(name, false)

#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        if (!(cond)) throw CheckFailed(std::string("CHECK failed line ") + std::to_string(__LINE__) + \
                                       ": " #cond);                                                   \
    } while (0)
#define CHECK_EQ(a, b)                                                                                   \
    do {                                                                                                 \
        auto va_ = (a);                                                                                  \
        auto vb_ = (b);                                                                                  \
        if (!(va_ == vb_))                                                                               \
            throw CheckFailed(std::string("CHECK_EQ failed line ") + std::to_string(__LINE__) + ": " #a \
                              " = " + std::to_string(va_) + " vs " #b " = " + std::to_string(vb_));     \
    } while (0)

// Helpers shared by the runtime cases.
template <class Fn>
inline void run1(Fn&& f) {
    avsg_emu::launch(1, std::forward<Fn>(f));
}
inline uint32_t poison32() { return 0xA5A5A5A5u; }
inline uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

inline int run_main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s CASE|--list\n", argv[0]);
        return 5;
    }
    std::string name = argv[1];
    if (name == "--list") {
        for (auto& kv : registry()) std::printf("%s\n", kv.first.c_str());
        return 0;
    }
    auto it = registry().find(name);
    if (it == registry().end()) {
        std::printf("UNKNOWN CASE %s\n", name.c_str());
        return 5;
    }
    avsg_emu::set_hazard_checks(it->second.hazards);
    try {
        it->second.fn();
    } catch (const CheckFailed& e) {
        std::printf("CHECKFAIL: %s\n", e.what());
        return 2;
    } catch (const AscendC::EmuError& e) {
        std::printf("EMUERROR: %s\n", e.what());
        return 3;
    } catch (const std::exception& e) {
        std::printf("EXCEPTION: %s\n", e.what());
        return 4;
    }
    std::printf("OK\n");
    return 0;
}
