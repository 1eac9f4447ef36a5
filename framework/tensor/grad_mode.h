#pragma once
// Grad mode: whether differentiable ops record autograd history. It is thread-local, so several
// ranks running as threads of one process do not interfere. On by default in every thread.
//
// Usage:
//   {
//     hsgd::NoGradGuard no_grad;      // e.g. around an optimizer update or evaluation
//     for (hsgd::Tensor& param : params) param.add_(param.grad(), -0.1f);
//   }                                 // previous mode restored here

namespace hsgd {

// True when ops called on this thread record autograd history.
bool grad_mode_enabled();
// Sets the mode for this thread. Prefer the RAII guards below.
void set_grad_mode_enabled(bool enabled);

// Disables recording for its lifetime and restores the previous mode on destruction.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode_enabled(false); }
  ~NoGradGuard() { set_grad_mode_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace hsgd
