#pragma once
#include <functional>
#include <string>
namespace at_npu { namespace native { struct OpCommand { static void RunOpApi(const std::string&, const std::function<int()>&); }; } }
