// chat.h - chat templates: recognising a template's format and rendering a conversation in C
// (internal; the public calls are tri_chat_* in triforce.h, docs/formats.md describes the formats).
#ifndef TRI_CHAT_H
#define TRI_CHAT_H

#include <stddef.h>

#include "triforce.h"

// What a template text says beyond its format: the variant switches the renderer needs to give
// jinja2's output byte for byte.
typedef struct tri__chat_spec {
    tri_chat_format format;
    bool bos;                   // the template writes bos_token (Llama-3, Gemma, Mistral)
    bool gen_prompt_always;     // Llama-3's first template: the assistant header whatever
                                // add_generation_prompt says
    bool eos_space;             // Mistral v0.1: a space after each answer's eos_token
    bool skip_empty_system;     // Phi-3.5: an empty system message writes nothing
    const char *default_system; // ChatML: the system message written when the conversation has
                                // none (SmolLM2, Qwen2), unescaped, malloc'd; NULL when none
    size_t default_system_len;
} tri__chat_spec;

// Recognises template text (len bytes, any bytes) as one of the formats. UNSUPPORTED, with a
// message naming what was seen and how to name a format instead, when it is none of them.
// *out's default_system is freed with tri__chat_spec_clear.
tri_status tri__chat_detect(const char *text, size_t len, tri__chat_spec *out);
void tri__chat_spec_clear(tri__chat_spec *spec);

// The spec for (template text, format): format AUTO recognises tmpl (len bytes); a named format
// takes tmpl's variant when tmpl is of that format. tmpl may be NULL for a named format.
tri_status tri__chat_resolve(const char *tmpl, size_t len, tri_chat_format format, tri__chat_spec *spec);

// Renders messages as spec says into buf (cap bytes, NUL-terminated when cap > 0); *n_out gets
// the length needed without the NUL. INVALID_ARGUMENT when the template would refuse the
// conversation (jinja2's raise_exception: roles not alternating, a system message Gemma or
// Mistral does not take) or cap is too small (after *n_out is set).
tri_status tri__chat_render(const tri__chat_spec *spec, const char *bos, const char *eos,
                            const tri_chat_message *msgs, size_t n, bool add_generation_prompt,
                            char *buf, size_t cap, size_t *n_out);

// The chat template of an HF tokenizer_config.json (text of len bytes, path for messages): the
// "chat_template" string, or from a list of {"name", "template"} the one named "default" (else
// the first). *tmpl (malloc'd, NUL-terminated) is NULL when the file has none. bos and eos
// (may be NULL) receive "bos_token" / "eos_token" when present (a string or an object with
// "content"), malloc'd, else NULL. BAD_FORMAT for broken JSON or fields of the wrong type.
tri_status tri__chat_from_tokenizer_config(const char *path, const char *text, size_t len, char **tmpl,
                                           char **bos, char **eos);

// ---- the model's template through the interpreter (model/model-chat.c uses these) ----

struct json_object;

// Renders template text tmpl (len bytes; may be NULL for a built-in format) as format says
// (AUTO: the interpreter, else the built-in format its markers show; JINJA: the interpreter
// only; a named format: that format) over JSON messages (an array of objects with a string
// "role") and tools (an array, or NULL); where names the template's source in messages.
// Output and errors as tri_chat_render.
tri_status tri__chat_render_json(const char *where, const char *tmpl, size_t len, tri_chat_format format,
                                 const char *bos, const char *eos, struct json_object *msgs, struct json_object *tools,
                                 bool add_generation_prompt, char *buf, size_t cap, size_t *n_out);
// The messages as a JSON array of {role, content}; NULL when out of memory.
struct json_object *tri__chat_messages_json(const tri_chat_message *msgs, size_t n);
// Parses text as a JSON array (of objects with a string "role" when messages); what names it in
// messages. BAD_FORMAT for anything else.
tri_status tri__chat_parse_array(const char *what, const char *text, bool messages, struct json_object **out);
// How template text is rendered under AUTO: JINJA when the interpreter parses it, else the
// built-in format it shows; UNSUPPORTED (naming where, and why) when neither.
tri_status tri__chat_format_of(const char *where, const char *tmpl, size_t len, tri_chat_format *out);

#endif  // TRI_CHAT_H
