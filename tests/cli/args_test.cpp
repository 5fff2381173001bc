#include "cli/args.h"

#include <gtest/gtest.h>

namespace fitllm::cli {
namespace {

struct Parsed {
    std::string model;
    std::string prompt;
    int ctx = 0;
    bool json = false;
};

ArgParser make(Parsed& p) {
    ArgParser a("fitllm test MODEL [OPTIONS]", "A test command.");
    a.positional("MODEL", "the model", &p.model);
    a.option("-p, --prompt", "TEXT", "the prompt", &p.prompt);
    a.option("-c, --ctx-size", "N", "context length", &p.ctx);
    a.flag("--json", &p.json, "JSON output");
    return a;
}

TEST(ArgParser, ShortLongInlineAndPositionals) {
    Parsed p;
    ArgParser a = make(p);
    EXPECT_TRUE(a.parse({"-c", "512", "model.gguf", "--prompt=hi there", "--json"}));
    EXPECT_EQ(p.model, "model.gguf");
    EXPECT_EQ(p.prompt, "hi there");
    EXPECT_EQ(p.ctx, 512);
    EXPECT_TRUE(p.json);
}

TEST(ArgParser, DoubleDashEndsOptions) {
    Parsed p;
    ArgParser a = make(p);
    EXPECT_TRUE(a.parse({"--", "-weird-name.gguf"}));
    EXPECT_EQ(p.model, "-weird-name.gguf");
}

TEST(ArgParser, ErrorsNameTheArgument) {
    auto message = [](std::vector<std::string> args) {
        Parsed p;
        ArgParser a = make(p);
        try {
            a.parse(args);
        } catch (const UsageError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(message({"m", "--bogus"}), "unknown option '--bogus' (see --help)");
    EXPECT_EQ(message({"m", "-c"}), "option '-c' needs a value N");
    EXPECT_EQ(message({"m", "-c", "12x"}), "--ctx-size: '12x' is not a whole number");
    EXPECT_EQ(message({"m", "-c", "99999999999"}), "--ctx-size: 99999999999 is out of range");
    EXPECT_EQ(message({"m", "--json=1"}), "option '--json' takes no value");
    EXPECT_EQ(message({}), "missing MODEL (see --help)");
    EXPECT_EQ(message({"a", "b"}), "unexpected argument 'b'");
}

TEST(ArgParser, HelpListsEveryOption) {
    Parsed p;
    ArgParser a = make(p);
    const std::string help = a.help();
    EXPECT_NE(help.find("usage: fitllm test MODEL [OPTIONS]"), std::string::npos);
    EXPECT_NE(help.find("-c, --ctx-size N"), std::string::npos);
    EXPECT_NE(help.find("--json"), std::string::npos);
    EXPECT_NE(help.find("-h, --help"), std::string::npos);
    testing::internal::CaptureStdout();
    EXPECT_FALSE(a.parse({"--help"}));
    EXPECT_EQ(testing::internal::GetCapturedStdout(), help);
}

}  // namespace
}  // namespace fitllm::cli
