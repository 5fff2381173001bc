#pragma once
// The errors fitllm throws. Every one derives from fitllm::Error, so callers can catch broadly or
// precisely; modules derive their own (gguf::FormatError, io::IoError, ...) from it too. The
// messages say what and where: the file, the key or tensor, the option, the bytes.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "fitllm/export.h"

namespace fitllm {

class FITLLM_API Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A configuration the engine refuses: a value out of range, options that contradict each other,
// a device that cannot be opened. The message names the setting.
class FITLLM_API ConfigError : public Error {
public:
    using Error::Error;
};

// A request for memory that the budget has no room for, refused before the OS was asked (the
// process lives on). what() names the pool, what the bytes were for and what every pool holds.
class FITLLM_API BudgetError : public Error {
public:
    BudgetError(const std::string& message, std::string pool, uint64_t requested, uint64_t capacity, uint64_t in_use)
        : Error(message), pool_(std::move(pool)), requested_(requested), capacity_(capacity), in_use_(in_use) {}
    const std::string& pool() const { return pool_; }
    uint64_t requested() const { return requested_; }  // bytes asked for
    uint64_t capacity() const { return capacity_; }    // the device's budget
    uint64_t in_use() const { return in_use_; }        // bytes charged when it was asked

private:
    std::string pool_;
    uint64_t requested_, capacity_, in_use_;
};

// The plan of a load does not fit its budget (even after fitting, when that was asked for):
// nothing was loaded. what() says which pool would not fit; plan_text() is the whole plan, as
// `fitllm plan` prints it.
class FITLLM_API DoesNotFitError : public Error {
public:
    DoesNotFitError(const std::string& message, std::string device, uint64_t needed, uint64_t budget,
                    std::string plan_text)
        : Error(message),
          device_(std::move(device)),
          needed_(needed),
          budget_(budget),
          plan_text_(std::move(plan_text)) {}
    const std::string& device() const { return device_; }  // "host", or the offload device's name
    uint64_t needed() const { return needed_; }            // the plan's bytes on that device
    uint64_t budget() const { return budget_; }
    const std::string& plan_text() const { return plan_text_; }

private:
    std::string device_;
    uint64_t needed_, budget_;
    std::string plan_text_;
};

}  // namespace fitllm
