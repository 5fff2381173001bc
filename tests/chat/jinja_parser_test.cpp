// The parser: jinja2's grammar and its error messages, with the line:column of the offending
// token; constructs fitllm does not implement are refused here, before any rendering, and
// named in the error (Kind::unsupported).
#include <gtest/gtest.h>

#include "chat/chat_template.h"

namespace fitllm::chat {
namespace {

TemplateError parse_error(std::string_view source) {
    try {
        ChatTemplate::parse(source);
    } catch (const TemplateError& e) {
        return e;
    }
    ADD_FAILURE() << "expected a TemplateError for: " << source;
    return TemplateError(TemplateError::Kind::syntax, "", {}, "");
}

TEST(JinjaParser, AcceptsTheStatementsChatTemplatesUse) {
    EXPECT_NO_THROW(ChatTemplate::parse(
        "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{% set x, y = 1, 2 %}{% set b %}x{% endset %}"
        "{% macro m(a, b=1) %}{{ a }}{% endmacro %}{% with q = 1 %}{{ q }}{% endwith %}"
        "{% for k, v in d.items() if k %}{% break %}{% else %}{% endfor %}"
        "{% if a %}{% elif b %}{% else %}{% endif %}{% filter upper %}x{% endfilter %}"
        "{% generation %}g{% endgeneration %}{% print 1, 2 %}{% raw %}{{{% endraw %}"
        "{{ a if b else c }}{{ x|default('d')|trim }}{{ y is not none }}{{ z[1:-1:2] }}{{ f(1, k=2,) }}"));
}

TEST(JinjaParser, UnknownTagNamesTheTagAndItsPosition) {
    const TemplateError e = parse_error("line one\n  {% frobnicate %}");
    EXPECT_EQ(e.kind(), TemplateError::Kind::syntax);
    EXPECT_EQ(e.line(), 2u);
    EXPECT_EQ(e.column(), 6u);
    EXPECT_EQ(e.detail(), "Encountered unknown tag 'frobnicate'.");
    EXPECT_STREQ(e.what(), "chat_template:2:6: Encountered unknown tag 'frobnicate'.");
}

TEST(JinjaParser, UnclosedBlockSaysWhatWasOpen) {
    const TemplateError e = parse_error("{% for m in messages %}\n{% if true %}never closed");
    EXPECT_EQ(e.detail(),
              "Unexpected end of template. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'. "
              "The innermost block that needs to be closed is 'if'.");
    EXPECT_EQ(e.line(), 2u);
}

TEST(JinjaParser, MismatchedEndTagIsANestingMistake) {
    const TemplateError e = parse_error("{% for x in y %}{% endif %}");
    EXPECT_EQ(e.detail(),
              "Encountered unknown tag 'endif'. Jinja was looking for the following tags: 'endfor' or 'else'. "
              "The innermost block that needs to be closed is 'for'.");
    EXPECT_EQ(e.column(), 20u);
}

TEST(JinjaParser, ExpressionErrorsUseJinja2Wording) {
    EXPECT_EQ(parse_error("{{ 1 + }}").detail(), "unexpected 'end of print statement'");
    EXPECT_EQ(parse_error("{{ x ").detail(), "unexpected end of template, expected 'end of print statement'.");
    EXPECT_EQ(parse_error("{{ x is defined is defined }}").detail(), "You cannot chain multiple tests with is");
    EXPECT_EQ(parse_error("{% set true = 1 %}").detail(), "can't assign to 'const'");
    EXPECT_EQ(parse_error("{{ a b }}").detail(), "expected token 'end of print statement', got 'b'");
    EXPECT_EQ(parse_error("{% macro m(a=1, b) %}{% endmacro %}").detail(),
              "non-default argument follows default argument");
}

TEST(JinjaParser, UnknownFiltersAndTestsFailAtParseTime) {
    const TemplateError filter = parse_error("{{ x }}\n{{ 'x'|frobnicate }}");
    EXPECT_EQ(filter.kind(), TemplateError::Kind::syntax);
    EXPECT_EQ(filter.detail(), "No filter named 'frobnicate'.");
    EXPECT_EQ(filter.line(), 2u);
    EXPECT_EQ(filter.column(), 8u);
    EXPECT_EQ(parse_error("{{ 1 is frobnicated }}").detail(), "No test named 'frobnicated'.");
}

TEST(JinjaParser, UnknownFiltersInsideIfBlocksFailOnlyWhenReached) {
    // jinja2 3.x checks filters and tests in if blocks and inline ifs at run time.
    RenderOptions options;
    const auto render = [&](std::string_view source) {
        return ChatTemplate::parse(source).render(std::vector<ChatMessage>{}, options);
    };
    EXPECT_EQ(render("{% if false %}{{ x|frobnicate }}{% endif %}ok"), "ok");
    EXPECT_EQ(render("{{ 'a' if true else x|frobnicate }}"), "a");
    EXPECT_EQ(render("{% if false %}{{ 'x'|urlize }}{% endif %}ok"), "ok");
    try {
        render("{% if true %}\n  {{ 'x'|frobnicate }}{% endif %}");
        FAIL();
    } catch (const TemplateError& e) {
        EXPECT_EQ(e.kind(), TemplateError::Kind::runtime);
        EXPECT_EQ(e.detail(), "No filter named 'frobnicate' found.");
        EXPECT_EQ(e.line(), 2u);
    }
    // ... but a loop or macro body inside the if is checked when parsed, as jinja2 does.
    EXPECT_EQ(parse_error("{% if false %}{% for i in [1] %}{{ i|frobnicate }}{% endfor %}{% endif %}").detail(),
              "No filter named 'frobnicate'.");
}

TEST(JinjaParser, BreakOutsideALoopIsRejected) {
    EXPECT_EQ(parse_error("{% break %}").detail(), "'break' outside of a for loop");
    EXPECT_EQ(parse_error("{% for x in y %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}").detail(),
              "'continue' outside of a for loop");
}

struct Unsupported {
    const char* source;
    const char* construct;  // what the message must name
    uint32_t column;
};

TEST(JinjaParser, UnsupportedConstructsAreNamedWithTheirPosition) {
    const Unsupported cases[] = {
        {"{% include 'x.jinja' %}", "'{% include %}' tag", 4},
        {"{% extends 'base' %}", "'{% extends %}' tag", 4},
        {"{% block b %}{% endblock %}", "'{% block %}' tag", 4},
        {"{% import 'm' as m %}", "'{% import %}' tag", 4},
        {"{% call m() %}x{% endcall %}", "'{% call %}' tag", 4},
        {"{% for x in y recursive %}{% endfor %}", "recursive for loop", 15},
        {"{{ 'x'|urlize }}", "'urlize' filter", 8},
        {"{{ f(*args) }}", "'*args' and '**kwargs'", 6},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.source);
        const TemplateError e = parse_error(c.source);
        EXPECT_EQ(e.kind(), TemplateError::Kind::unsupported);
        EXPECT_NE(e.detail().find(c.construct), std::string::npos) << e.detail();
        EXPECT_NE(e.detail().find("not supported"), std::string::npos) << e.detail();
        EXPECT_EQ(e.line(), 1u);
        EXPECT_EQ(e.column(), c.column) << e.what();
    }
}

TEST(JinjaParser, DeepNestingIsAnErrorNotACrash) {
    const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
    EXPECT_NE(parse_error(parens).detail().find("nested too deeply"), std::string::npos);
    const std::string minus = "{{ " + std::string(5000, '-') + "1 }}";
    EXPECT_NE(parse_error(minus).detail().find("nested too deeply"), std::string::npos);
    std::string nots = "{{ ";
    for (int i = 0; i < 5000; ++i) nots += "not ";
    EXPECT_NE(parse_error(nots + "x }}").detail().find("nested too deeply"), std::string::npos);
    std::string ifs;
    for (int i = 0; i < 50; ++i) ifs += "{% if x %}";
    for (int i = 0; i < 50; ++i) ifs += "{% endif %}";
    EXPECT_NO_THROW(ChatTemplate::parse(ifs));
}

TEST(JinjaParser, ErrorsNameTheTemplate) {
    try {
        ChatTemplate::parse("{% if %}", "model.gguf:tokenizer.chat_template");
        FAIL();
    } catch (const TemplateError& e) {
        EXPECT_EQ(e.template_name(), "model.gguf:tokenizer.chat_template");
        EXPECT_EQ(std::string(e.what()).rfind("model.gguf:tokenizer.chat_template:1:7: ", 0), 0u) << e.what();
    }
}

}  // namespace
}  // namespace fitllm::chat
