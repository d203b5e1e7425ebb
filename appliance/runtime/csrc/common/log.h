// One-line diagnostics on stderr, prefixed with the rank, written with a single write() so
// lines from threads and processes do not interleave.
#pragma once

#include <string>

namespace appliance {
void log_line(int rank, const std::string& text);
}
