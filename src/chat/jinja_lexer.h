#pragma once
// Template source to tokens, as jinja2's lexer produces them under the settings HF uses for
// chat templates (trim_blocks and lstrip_blocks on, keep_trailing_newline off). Whitespace
// control is settled here, as in jinja2: `{%-`/`-%}` strip the whitespace beside the tag,
// lstrip_blocks removes the indentation before a block or comment tag that starts a line,
// trim_blocks removes the newline after one, and `{%+`/`+%}` opt out of both. Comments never
// reach the parser.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/template_error.h"

namespace fitllm::chat::jinja {

enum class TokenType : uint8_t {
    data,            // text outside tags
    block_begin,     // {%
    block_end,       // %}
    variable_begin,  // {{
    variable_end,    // }}
    name,
    string,
    integer,
    floating,
    op,  // operators and punctuation: + - * / // % ** ~ == != < <= > >= = . : | , ; ( ) [ ] { }
    eof,
};

struct Token {
    TokenType type = TokenType::eof;
    std::string text;  // data: the text; name: the identifier; string: the decoded value; op: the operator
    int64_t int_value = 0;
    double float_value = 0;
    SourcePos pos;

    bool is_op(std::string_view o) const { return type == TokenType::op && text == o; }
    bool is_name(std::string_view n) const { return type == TokenType::name && text == n; }
};

struct LexerOptions {
    bool trim_blocks = true;
    bool lstrip_blocks = true;
};

// Throws TemplateError (Kind::syntax) with the position of the offending character.
std::vector<Token> tokenize(std::string_view source, const std::string& template_name, LexerOptions options = {});

// How jinja2 names a token in "expected X, got Y" messages: names as themselves, operators
// quoted, the others by kind ("end of print statement", "end of template", "string").
std::string describe(const Token& token);

}  // namespace fitllm::chat::jinja
