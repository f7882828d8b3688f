// Asio and Beast are compiled once here (BOOST_*_SEPARATE_COMPILATION) instead of
// in every translation unit that includes them: it halves build times on 2 cores.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
