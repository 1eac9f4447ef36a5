#pragma once
// hsgd's error types and checking macros, used by every layer (comm is the lowest layer, so
// they live here; framework, optim, models and apps include "comm/error.h").
//
// Contract: a wrong input or a failed operation throws; nothing prints and continues. A message
// names the bad value and what was expected, e.g.
//   HSGD_CHECK(last == pg_size, "HierarchicalModelAverager: last group size ", last,
//              " must equal the process group size ", pg_size);
// throws hsgd::InvalidArgument with
//   "HierarchicalModelAverager: last group size 6 must equal the process group size 8
//    [check 'last == pg_size' failed at hierarchical_model_averager.cpp:42]"

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hsgd {

// Base of every error hsgd throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value the callee cannot accept (shape, index, option, file contents).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A communication failure: a peer closed the connection, the server refused us, I/O failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A blocking operation did not complete within its deadline. The message names the operation,
// the group or endpoint and, where known, who did not arrive.
class Timeout : public CommError {
 public:
  using CommError::CommError;
};

// Concatenates any streamable values into one string, as the check macros do for their
// messages; every layer builds its messages with it.
//
// Usage:
//   std::string m = hsgd::str_cat("rank ", 3, " of ", 8);  // "rank 3 of 8"
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  if constexpr (sizeof...(Args) > 0) (out << ... << std::forward<Args>(args));
  return out.str();
}

namespace detail {

// Strips the directory part of __FILE__ for shorter messages.
constexpr const char* base_name(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

template <typename E, typename... Args>
[[noreturn]] void throw_check(const char* expr, const char* file, int line, Args&&... args) {
  std::string message = str_cat(std::forward<Args>(args)...);
  if (!message.empty()) message += ' ';
  throw E(str_cat(message, "[check '", expr, "' failed at ", base_name(file), ":", line, "]"));
}

}  // namespace detail
}  // namespace hsgd

// Throws hsgd::InvalidArgument when cond is false; the remaining arguments form the message.
#define HSGD_CHECK(cond, ...)                                                                    \
  do {                                                                                           \
    if (!(cond)) [[unlikely]] {                                                                  \
      ::hsgd::detail::throw_check<::hsgd::InvalidArgument>(#cond, __FILE__,                      \
                                                           __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                            \
  } while (false)

// Same as HSGD_CHECK but throws the given subclass of hsgd::Error.
#define HSGD_CHECK_AS(ErrorType, cond, ...)                                        \
  do {                                                                             \
    if (!(cond)) [[unlikely]] {                                                    \
      ::hsgd::detail::throw_check<ErrorType>(#cond, __FILE__,                      \
                                             __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                              \
  } while (false)

// Binary comparison checks whose message carries both values: "... (got 3 vs 4)".
#define HSGD_CHECK_OP_(a, b, op, ...)                                                          \
  do {                                                                                         \
    const auto& hsgd_a_ = (a);                                                                 \
    const auto& hsgd_b_ = (b);                                                                 \
    if (!(hsgd_a_ op hsgd_b_)) [[unlikely]] {                                                  \
      ::hsgd::detail::throw_check<::hsgd::InvalidArgument>(                                    \
          #a " " #op " " #b, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__, " (got ", hsgd_a_, \
          " vs ", hsgd_b_, ")");                                                               \
    }                                                                                          \
  } while (false)
#define HSGD_CHECK_EQ(a, b, ...) HSGD_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define HSGD_CHECK_NE(a, b, ...) HSGD_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define HSGD_CHECK_LT(a, b, ...) HSGD_CHECK_OP_(a, b, <, __VA_ARGS__)
#define HSGD_CHECK_LE(a, b, ...) HSGD_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define HSGD_CHECK_GT(a, b, ...) HSGD_CHECK_OP_(a, b, >, __VA_ARGS__)
#define HSGD_CHECK_GE(a, b, ...) HSGD_CHECK_OP_(a, b, >=, __VA_ARGS__)

// Unconditionally throws ErrorType with the given message parts.
#define HSGD_THROW(ErrorType, ...) throw ErrorType(::hsgd::str_cat(__VA_ARGS__))
