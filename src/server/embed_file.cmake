# Turns a file into C++ source defining `std::string_view NAME()` in namespace fitllm::server, so
# the server carries its web page inside the binary. Run as:
#   cmake -DINPUT=file -DOUTPUT=file.cpp -DNAME=web_page -P embed_file.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR n_bytes "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
# 16 bytes per line.
string(REGEX REPLACE "(('[^']+',){16})" "\\1\n    " bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
"// Generated from ${INPUT} by embed_file.cmake; do not edit.
#include <string_view>

namespace fitllm::server {
namespace {
const char kData[] = {
    ${bytes} '\\0'};
}  // namespace
std::string_view ${NAME}() {
    return std::string_view(kData, ${n_bytes});
}
}  // namespace fitllm::server
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
