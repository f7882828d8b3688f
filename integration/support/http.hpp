#pragma once
// Moved to the shared test support (test_support/http.hpp); the harness's names stay.
#include "support/wait.hpp"
#include "test_support/http.hpp"

namespace idem::it {

using test::connect_errno;
using test::free_port;
using test::header_value;
using test::header_values;
using test::Headers;
using test::HttpClient;
using test::HttpResponse;
using test::iequals;
using test::parse_response;
using test::port_open;
using test::raw_exchange;
using test::RawConnection;
using test::try_parse_response;
using test::wait_for_port;

}  // namespace idem::it
