// The built-in templates fitllm falls back to when a model file has none. Each is a published
// model's own chat_template, kept byte-identical to its copy under tests/chat/fixtures/templates
// (a test checks this), so the jinja2 goldens of those fixtures cover the fallbacks too.
#include "chat/chat_template.h"

namespace fitllm::chat {

// teknium/OpenHermes-2.5-Mistral-7B (fixture chatml.jinja)
constexpr std::string_view kChatmlTemplate =
    R"tmpl({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})tmpl";

// meta-llama/Meta-Llama-3-8B-Instruct (fixture llama-3-instruct.jinja)
constexpr std::string_view kLlama3Template =
    R"tmpl({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})tmpl";

// google/gemma-3 instruct models (fixture gemma-3-it.jinja)
constexpr std::string_view kGemmaTemplate = R"tmpl({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
)tmpl";

// mistralai/Mistral-7B-Instruct-v0.1 (fixture mistral-7b-instruct-v0.1.jinja)
constexpr std::string_view kMistralTemplate = R"tmpl({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)tmpl";

std::string_view builtin_format_name(BuiltinFormat format) {
    switch (format) {
        case BuiltinFormat::chatml:
            return "ChatML";
        case BuiltinFormat::llama3:
            return "Llama 3";
        case BuiltinFormat::gemma:
            return "Gemma";
        case BuiltinFormat::mistral:
            return "Mistral";
    }
    return "?";
}

std::string_view builtin_template_source(BuiltinFormat format) {
    switch (format) {
        case BuiltinFormat::chatml:
            return kChatmlTemplate;
        case BuiltinFormat::llama3:
            return kLlama3Template;
        case BuiltinFormat::gemma:
            return kGemmaTemplate;
        case BuiltinFormat::mistral:
            return kMistralTemplate;
    }
    return {};
}

}  // namespace fitllm::chat
