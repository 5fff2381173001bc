// The lexer: tokens and their positions, string and number literals as Python reads them,
// and whitespace control as jinja2 applies it under HF's settings (trim_blocks, lstrip_blocks).
// Expected renders here were checked against jinja2; the snippets in fixtures/ cover more.
#include "chat/jinja_lexer.h"

#include <gtest/gtest.h>

#include <chrono>

#include "chat/chat_template.h"

namespace fitllm::chat::jinja {
namespace {

std::string render(std::string_view source) {
    RenderOptions options;
    options.add_generation_prompt = false;
    return ChatTemplate::parse(source).render(std::vector<ChatMessage>{}, options);
}

TemplateError syntax_error_of(std::string_view source) {
    try {
        ChatTemplate::parse(source);
    } catch (const TemplateError& e) {
        return e;
    }
    ADD_FAILURE() << "expected a TemplateError for: " << source;
    return TemplateError(TemplateError::Kind::syntax, "", {}, "");
}

TEST(JinjaLexer, SplitsDataAndTags) {
    const auto tokens = tokenize("Hi {{ name }}!{# note #}{% if x %}", "t");
    ASSERT_EQ(tokens.size(), 10u);
    EXPECT_EQ(tokens[0].type, TokenType::data);
    EXPECT_EQ(tokens[0].text, "Hi ");
    EXPECT_EQ(tokens[1].type, TokenType::variable_begin);
    EXPECT_TRUE(tokens[2].is_name("name"));
    EXPECT_EQ(tokens[3].type, TokenType::variable_end);
    EXPECT_EQ(tokens[4].text, "!");
    EXPECT_EQ(tokens[5].type, TokenType::block_begin);  // the comment left no token
    EXPECT_TRUE(tokens[6].is_name("if"));
    EXPECT_TRUE(tokens[7].is_name("x"));
    EXPECT_EQ(tokens[8].type, TokenType::block_end);
    EXPECT_EQ(tokens[9].type, TokenType::eof);
}

TEST(JinjaLexer, PositionsAreLinesAndCodePointColumns) {
    const auto tokens = tokenize("é{{ x }}\n  {% if y %}", "t");
    EXPECT_TRUE(tokens[2].is_name("x"));
    EXPECT_EQ(tokens[2].pos.line, 1u);
    EXPECT_EQ(tokens[2].pos.column, 5u);  // é counts as one column
    const Token& y = tokens[tokens.size() - 3];
    EXPECT_TRUE(y.is_name("y"));
    EXPECT_EQ(y.pos.line, 2u);
    EXPECT_EQ(y.pos.column, 9u);
}

TEST(JinjaLexer, DecodesStringLiteralsLikePython) {
    const auto tokens = tokenize(R"({{ 'a\nb' "q\"q" '\x41\u00e9\U0001F999' '\d' 'it\'s' '\101' }})", "t");
    ASSERT_EQ(tokens[1].type, TokenType::string);
    EXPECT_EQ(tokens[1].text, "a\nb");
    EXPECT_EQ(tokens[2].text, "q\"q");
    EXPECT_EQ(tokens[3].text, "A\xC3\xA9\xF0\x9F\xA6\x99");
    EXPECT_EQ(tokens[4].text, "\\d");  // unknown escapes stay as written
    EXPECT_EQ(tokens[5].text, "it's");
    EXPECT_EQ(tokens[6].text, "A");
    EXPECT_EQ(render("{{ 'a' \"b\" 'c' }}"), "abc");  // adjacent literals concatenate
}

TEST(JinjaLexer, ReadsNumbersLikePython) {
    const auto tokens = tokenize("{{ 1_000 0x1F 0o17 0b101 1e3 2.5 1.5e-2 }}", "t");
    EXPECT_EQ(tokens[1].int_value, 1000);
    EXPECT_EQ(tokens[2].int_value, 31);
    EXPECT_EQ(tokens[3].int_value, 15);
    EXPECT_EQ(tokens[4].int_value, 5);
    EXPECT_EQ(tokens[5].type, TokenType::floating);
    EXPECT_DOUBLE_EQ(tokens[5].float_value, 1000.0);
    EXPECT_DOUBLE_EQ(tokens[6].float_value, 2.5);
    EXPECT_DOUBLE_EQ(tokens[7].float_value, 0.015);
}

TEST(JinjaLexer, DelimitersInsideStringsAreText) {
    EXPECT_EQ(render("{{ '}}' }}|{{ \"{%\" }}|{{ {'a': '}}'}['a'] }}"), "}}|{%|}}");
}

TEST(JinjaWhitespace, TrimBlocksRemovesTheNewlineAfterABlockTag) {
    EXPECT_EQ(render("{% if true %}\nline\n{% endif %}\nafter"), "line\nafter");
}

TEST(JinjaWhitespace, LstripBlocksRemovesIndentationBeforeBlockTags) {
    EXPECT_EQ(render("a\n  {% if true %}\n    b\n  {% endif %}\nc"), "a\n    b\nc");
    EXPECT_EQ(render("text   {% if true %}x{% endif %}   text"), "text   x   text");  // not at line start
}

TEST(JinjaWhitespace, LstripBlocksLeavesVariableTagsAlone) {
    EXPECT_EQ(render("a\n    {{ 'v' }}\n    {% if true %}x{% endif %}"), "a\n    v\nx");
}

TEST(JinjaWhitespace, MinusStripsAllWhitespaceBesideTheTag) {
    EXPECT_EQ(render("  {%- if true -%}  x  {%- endif -%}  "), "x");
    EXPECT_EQ(render("a {{- ' b ' -}} c"), "a b c");
    EXPECT_EQ(render("A\n\n\n   {%- set x = 1 -%}\n\n\n   B"), "AB");
}

TEST(JinjaWhitespace, PlusKeepsWhatLstripAndTrimWouldRemove) {
    EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
    EXPECT_EQ(render("{% if true +%}\nkeep{% endif %}"), "\nkeep");
}

TEST(JinjaWhitespace, CommentsFollowBlockRules) {
    EXPECT_EQ(render("a\n  {# comment #}\nb"), "a\nb");
    EXPECT_EQ(render("a{#- strip -#}  b"), "ab");
}

TEST(JinjaWhitespace, OneTrailingNewlineIsDroppedAndCrLfBecomesLf) {
    EXPECT_EQ(render("x\n"), "x");
    EXPECT_EQ(render("x\n\n"), "x\n");
    EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
}

TEST(JinjaWhitespace, RawBlocksKeepTagsAsText) {
    EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(JinjaLexerErrors, NameTheCharacterAndItsPosition) {
    const TemplateError e = syntax_error_of("{{ x @ y }}");
    EXPECT_EQ(e.kind(), TemplateError::Kind::syntax);
    EXPECT_EQ(e.line(), 1u);
    EXPECT_EQ(e.column(), 6u);
    EXPECT_EQ(e.detail(), "unexpected char '@'");
    EXPECT_STREQ(e.what(), "chat_template:1:6: unexpected char '@'");
}

TEST(JinjaLexerErrors, UnclosedCommentPointsAtItsStart) {
    const TemplateError e = syntax_error_of("ok\n  {# never closed");
    EXPECT_EQ(e.line(), 2u);
    EXPECT_EQ(e.column(), 3u);
    EXPECT_EQ(e.detail(), "Missing end of comment tag");
}

TEST(JinjaLexerErrors, UnterminatedStringAndUnbalancedBrackets) {
    EXPECT_EQ(syntax_error_of("{{ 'abc }}").column(), 4u);
    const TemplateError e = syntax_error_of("{{ (1 + 2 }}");
    EXPECT_EQ(e.detail(), "unexpected '}', expected ')'");
    EXPECT_EQ(e.column(), 11u);
}

TEST(JinjaLexerErrors, BadEscapesAreSyntaxErrors) {
    EXPECT_EQ(syntax_error_of(R"({{ '\x4' }})").detail(), "truncated \\xXX escape");
    EXPECT_EQ(syntax_error_of(R"({{ '\N{DASH}' }})").kind(), TemplateError::Kind::unsupported);
}

TEST(JinjaLexer, ALongLineLexesInLinearTime) {
    // Every token's column was counted from the start of its line: 400 KB on one line took 8.4 s
    // (the model-load lock held all along). Linear, it takes a fraction of a second; the bound is
    // loose for busy and sanitized builds.
    std::string source = "\n{{ ";
    for (int i = 0; i < 100000; ++i) source += "x ~ ";  // 400 KB, 200,000 tokens on line 2
    source += "y }}";
    const auto start = std::chrono::steady_clock::now();
    const std::vector<Token> tokens = tokenize(source, "t");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(tokens.size(), 200005u);  // the newline, {{, 100,000 times x and ~, y, }}, the end
    EXPECT_EQ(tokens[200002].text, "y");
    EXPECT_EQ(tokens[200002].pos.line, 2u);
    EXPECT_EQ(tokens[200002].pos.column, 400004u);
    EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace fitllm::chat::jinja
