#pragma once
// Aliases every component shares, so names read the same across folders.
#include <chrono>
#include <cstdint>

#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>

namespace boost::asio {}
namespace boost::beast::http {}

namespace idem {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;

using boost::system::error_code;
template <class T>
using result = boost::system::result<T, error_code>;

using Millis = std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

}  // namespace idem
