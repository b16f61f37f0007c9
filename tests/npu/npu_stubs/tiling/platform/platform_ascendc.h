#pragma once
#include <cstdint>
namespace platform_ascendc { struct PlatformAscendC { uint32_t GetCoreNumAiv() const; };
struct PlatformAscendCManager { static PlatformAscendC* GetInstance(); }; }
