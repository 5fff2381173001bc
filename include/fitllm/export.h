/* What the shared library libfitllm exports: the public API, marked FITLLM_API. The library is
   built with hidden visibility, so nothing else of fitllm shows in its symbol table. C and C++. */
#ifndef FITLLM_EXPORT_H
#define FITLLM_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define FITLLM_API __attribute__((visibility("default")))
#else
#define FITLLM_API
#endif

#endif /* FITLLM_EXPORT_H */
