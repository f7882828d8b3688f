// Asio's SSL support compiled once (BOOST_ASIO_SEPARATE_COMPILATION), like asio_impl.cpp.
#include <boost/asio/ssl/impl/src.hpp>
