#include "framework/tensor/grad_mode.h"

namespace hsgd {

namespace {
thread_local bool t_grad_mode_enabled = true;
}  // namespace

bool grad_mode_enabled() { return t_grad_mode_enabled; }
void set_grad_mode_enabled(bool enabled) { t_grad_mode_enabled = enabled; }

}  // namespace hsgd
