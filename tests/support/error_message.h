#pragma once
// error_message<E>(body): runs body, expects it to throw E (default hsgd::InvalidArgument) and
// returns the message, so a test can check that the message names the bad values:
//   EXPECT_THAT(error_message([&] { a.reshape({7}); }), HasSubstr("7"));
// Records a test failure (and returns "") when body does not throw E.

#include <gtest/gtest.h>

#include <string>

#include "comm/error.h"

namespace hsgd::testing {

template <typename E = InvalidArgument, typename Body>
std::string error_message(Body body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception of the requested hsgd::Error type";
  return "";
}

}  // namespace hsgd::testing
