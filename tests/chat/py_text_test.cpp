// Python's str semantics that templates see through jinja2: float and str repr, Unicode
// whitespace, splitting, and case mappings including the one-to-many ones.
#include "chat/py_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fitllm::chat::py {
namespace {

TEST(JinjaPyText, FloatReprIsShortestRoundTripWithPythonsLayout) {
    EXPECT_EQ(float_repr(1.0), "1.0");
    EXPECT_EQ(float_repr(0.1), "0.1");
    EXPECT_EQ(float_repr(1.0 / 3), "0.3333333333333333");
    EXPECT_EQ(float_repr(1e16), "1e+16");
    EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
    EXPECT_EQ(float_repr(0.0001), "0.0001");
    EXPECT_EQ(float_repr(0.00001), "1e-05");
    EXPECT_EQ(float_repr(-2.5e-10), "-2.5e-10");
    EXPECT_EQ(float_repr(1.5e300), "1.5e+300");
    EXPECT_EQ(float_repr(-0.0), "-0.0");
    EXPECT_EQ(float_repr(std::numeric_limits<double>::infinity()), "inf");
    EXPECT_EQ(float_repr(std::nan("")), "nan");
}

TEST(JinjaPyText, StrReprChoosesQuotesAndEscapesLikeCPython) {
    EXPECT_EQ(repr("plain"), "'plain'");
    EXPECT_EQ(repr("it's"), "\"it's\"");
    EXPECT_EQ(repr("both ' and \""), "'both \\' and \"'");
    EXPECT_EQ(repr("tab\tnl\n\\"), "'tab\\tnl\\n\\\\'");
    EXPECT_EQ(repr(std::string("nul\0", 4)), "'nul\\x00'");
    EXPECT_EQ(repr("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\xA6\x99"),
              "'\xC3\xA9\xE4\xB8\xAD\xF0\x9F\xA6\x99'");                           // printable: kept
    EXPECT_EQ(repr("\xC2\xA0\xE2\x80\x8B\xE2\x80\xA8"), "'\\xa0\\u200b\\u2028'");  // not printable: escaped
}

TEST(JinjaPyText, StripAndSplitUseUnicodeWhitespace) {
    EXPECT_EQ(strip("\xE3\x80\x80 x\xC2\xA0\n", std::nullopt, true, true), "x");
    EXPECT_EQ(strip("xxhixx", std::string("x"), true, false), "hixx");
    EXPECT_EQ(split("  a \xE2\x80\x83 b  ", std::nullopt, -1), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(split("a,b,,c", std::string(","), 2), (std::vector<std::string>{"a", "b", ",c"}));
    EXPECT_EQ(rsplit("a b c", std::string(" "), 1), (std::vector<std::string>{"a b", "c"}));
    EXPECT_EQ(splitlines("a\nb\r\nc\x0b"
                         "d",
                         false),
              (std::vector<std::string>{"a", "b", "c", "d"}));
}

TEST(JinjaPyText, CaseMappingsIncludeFullMappingsAndFinalSigma) {
    EXPECT_EQ(upper("stra\xC3\x9F"
                    "e"),
              "STRASSE");                                                                      // ß -> SS
    EXPECT_EQ(title("\xEF\xAC\x81le"), "File");                                                // ﬁ -> Fi
    EXPECT_EQ(lower("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3"), "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82");  // ΟΔΟΣ -> οδος
    EXPECT_EQ(title("hello wORLD"), "Hello World");
    EXPECT_EQ(capitalize("hELLO"), "Hello");
    EXPECT_EQ(swapcase("AbC"), "aBc");
}

TEST(JinjaPyText, ReplaceAndFindCountCodePoints) {
    EXPECT_EQ(replace("abc", "", "-", -1), "-a-b-c-");
    EXPECT_EQ(replace("aaa", "a", "b", 2), "bba");
    EXPECT_EQ(find("h\xC3\xA9llo", "l", false), 2);
    EXPECT_EQ(count("banana", "an"), 2);
    EXPECT_EQ(length("h\xC3\xA9\xF0\x9F\xA6\x99"), 3u);
}

}  // namespace
}  // namespace fitllm::chat::py
