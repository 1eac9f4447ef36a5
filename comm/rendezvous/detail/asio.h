#pragma once
// The one header through which hsgd includes Boost.Asio.
//
// Boost 1.74's Asio does not compile with g++ 12 in C++20 mode unless <utility> is included
// before it (awaitable.hpp uses std::exchange without including <utility>), so every file that
// needs Asio includes this header instead of <boost/asio.hpp>.

// clang-format off
#include <utility>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
// clang-format on

namespace hsgd::comm {
namespace asio = boost::asio;
}  // namespace hsgd::comm
