// A short C++ program on fitllm's C++ API (fitllm/fitllm.h): loads a model inside a 1 GiB budget
// and prints the greedy continuation of a prompt, as `fitllm run -m MODEL -p PROMPT -n N --temp 0`
// prints it on stdout; with a budget too small, says where the bytes would go.
//
//   generate MODEL PROMPT [N] [BUDGET]
#include <fitllm/fitllm.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
    if (argc < 3) {
        std::cerr << "usage: " << argv[0] << " MODEL PROMPT [N] [BUDGET]\n";
        return 2;
    }
    try {
        fitllm::Engine engine = fitllm::Engine::load(
            {.model_path = argv[1], .mem = fitllm::parse_size(argc > 4 ? argv[4] : "1G")}, {.n_ctx = 512});
        std::cout << argv[2] << std::flush;
        engine.generate(argv[2], {.max_tokens = argc > 3 ? std::atoi(argv[3]) : 32, .sampling = {.temperature = 0}},
                        [](std::string_view piece) {
                            std::cout << piece << std::flush;
                            return true;
                        });
        std::cout << '\n';
    } catch (const fitllm::DoesNotFitError& e) {
        std::cerr << "generate: " << e.what() << "\n\n" << e.plan_text();
        return 3;
    } catch (const fitllm::Error& e) {
        std::cerr << "generate: " << e.what() << '\n';
        return 1;
    }
    return 0;
}
