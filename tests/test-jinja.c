// test-jinja.c - the Jinja interpreter of chat templates against jinja2.
//
// Golden renders come from jinja2 set up as Hugging Face transformers sets it up
// (tests/fixtures/chat-templates/make-goldens.py, committed as goldens.json) over llama.cpp's
// models/templates/*.jinja: every template the interpreter parses must render every
// conversation byte for byte as jinja2 does, and fail where jinja2 raised; the ones it refuses
// are exactly those docs/chat-templates.md lists. Then whitespace control, errors that name the
// line and column, and the limits that stop runaway templates.
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "test-util.h"
#include "triforce.h"

static const char *src_path(const char *rel) {
    static char path[4096];
    const char *src = getenv("TRI_TEST_SRC");
    cr_assert(src, "TRI_TEST_SRC is not set: run through meson test");
    snprintf(path, sizeof path, "%s/%s", src, rel);
    return path;
}

// Templates the interpreter refuses (UNSUPPORTED), each with what it lacks; docs/chat-templates.md
// lists the same.
static const char *const refused[] = {
    NULL,
};

static bool is_refused(const char *name) {
    for (size_t i = 0; refused[i]; i++)
        if (strcmp(refused[i], name) == 0) return true;
    return false;
}

static const int64_t now = 1721952000;  // make-goldens.py's NOW

Test(jinja, llama_cpp_templates_match_jinja2, .timeout = TT_TIMEOUT(120)) {
    size_t len;
    char *text = tt_read_file(src_path("fixtures/chat-templates/goldens.json"), &len);
    struct json_object *root = json_tokener_parse(text);
    free(text);
    cr_assert(root, "goldens.json does not parse");
    struct json_object *tmpls = json_object_object_get(root, "templates");
    size_t nt = json_object_array_length(tmpls), supported = 0, cases = 0, failures = 0;
    for (size_t i = 0; i < nt; i++) {
        struct json_object *t = json_object_array_get_idx(tmpls, i);
        const char *name = json_object_get_string(json_object_object_get(t, "template"));
        char rel[512];
        snprintf(rel, sizeof rel, "fixtures/chat-templates/%s", name);
        size_t tlen;
        char *src = tt_read_file(src_path(rel), &tlen);
        tri__jinja *j = NULL;
        char err[512];
        tri_status st = tri__jinja_parse(src, tlen, &j, err, sizeof err);
        free(src);
        struct json_object *cs = json_object_object_get(t, "cases");
        bool jinja2_compiles = true;
        for (size_t k = 0; k < json_object_array_length(cs); k++) {
            const char *e = json_object_get_string(json_object_object_get(json_object_array_get_idx(cs, k), "error"));
            if (e && strstr(e, "TemplateSyntaxError")) jinja2_compiles = false;
        }
        if (st) {
            if (!jinja2_compiles) continue;  // both refuse it
            if (st == TRI_STATUS_UNSUPPORTED && is_refused(name)) continue;
            cr_log_error("%s: refused (%s): %s", name, tri_status_str(st), err);
            failures++;
            continue;
        }
        if (is_refused(name)) {
            cr_log_error("%s: listed as refused but parses", name);
            failures++;
        }
        if (!jinja2_compiles) {
            cr_log_error("%s: jinja2 refuses it, the interpreter parses it", name);
            failures++;
        }
        supported++;
        for (size_t k = 0; k < json_object_array_length(cs); k++) {
            struct json_object *c = json_object_array_get_idx(cs, k);
            struct json_object *want = json_object_object_get(c, "output");
            char *out = NULL;
            size_t n = 0;
            st = tri__jinja_render(j, json_object_object_get(c, "context"), now, NULL, &out, &n, err, sizeof err);
            const char *cname = json_object_get_string(json_object_object_get(c, "name"));
            cases++;
            if (want) {
                const char *w = json_object_get_string(want);
                size_t wn = (size_t)json_object_get_string_len(want);
                if (st) {
                    cr_log_error("%s, %s: failed (%s) where jinja2 renders: %s", name, cname, tri_status_str(st), err);
                    failures++;
                } else if (n != wn || memcmp(out, w, n) != 0) {
                    size_t at = 0;
                    while (at < n && at < wn && out[at] == w[at]) at++;
                    cr_log_error("%s, %s: differs from jinja2 at byte %zu:\n got: %.80s\nwant: %.80s", name, cname, at,
                                 out + (at > 20 ? at - 20 : 0), w + (at > 20 ? at - 20 : 0));
                    failures++;
                }
            } else if (!st) {
                cr_log_error("%s, %s: renders where jinja2 raised %s", name, cname,
                             json_object_get_string(json_object_object_get(c, "error")));
                failures++;
            }
            free(out);
        }
        tri__jinja_free(j);
    }
    cr_log_info("%zu of %zu templates supported, %zu renders compared", supported, nt, cases);
    json_object_put(root);
    cr_assert_eq(failures, 0, "%zu differences from jinja2", failures);
    cr_assert_gt(supported, nt * 3 / 4);
}

// ---- small templates: each expectation is jinja2 3.1.6's output (tests/fixtures/chat-templates/check-small.py checks them) ----

static char *render(const char *tmpl, const char *ctx_json, tri_status *st, char *err, size_t errcap) {
    tri__jinja *j = NULL;
    *st = tri__jinja_parse(tmpl, strlen(tmpl), &j, err, errcap);
    if (*st) return NULL;
    struct json_object *ctx = ctx_json ? json_tokener_parse(ctx_json) : NULL;
    char *out = NULL;
    size_t n;
    tri__jinja_limits lim = {.max_steps = 100000, .max_output = 1 << 20, .max_memory = 256 << 20};
    *st = tri__jinja_render(j, ctx, now, &lim, &out, &n, err, errcap);
    json_object_put(ctx);
    tri__jinja_free(j);
    return out;
}

static void expect(const char *tmpl, const char *ctx, const char *want) {
    tri_status st;
    char err[512];
    char *out = render(tmpl, ctx, &st, err, sizeof err);
    cr_assert_eq(st, TRI_STATUS_OK, "%s: %s", tmpl, err);
    cr_expect_str_eq(out, want, "template %s", tmpl);
    free(out);
}

static void expect_error(const char *tmpl, const char *ctx, tri_status want, const char *msg) {
    tri_status st;
    char err[512];
    char *out = render(tmpl, ctx, &st, err, sizeof err);
    cr_expect_eq(st, want, "%s: status %s, message %s", tmpl, tri_status_str(st), err);
    cr_expect(strstr(err, msg), "%s: message '%s' lacks '%s'", tmpl, err, msg);
    free(out);
}

Test(jinja, whitespace_control_as_hf) {
    // trim_blocks, lstrip_blocks, "-" and "+", the trailing newline dropped (jinja2 3.1.6)
    expect("  {% if true %}\n  x\n  {% endif %}\n", NULL, "  x\n");
    expect("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    expect("a\n  {%+ if true %}b{% endif %}", NULL, "a\n  b");
    expect("{{ 'x' }}\n{# c #}\ny\n", NULL, "x\ny");
    expect("{% for i in range(3) %}\n{{ i }}\n{% endfor %}\n", NULL, "0\n1\n2\n");
    expect("a {{- ' b ' -}} c", NULL, "a b c");
    expect("x  {# comment #}  y", NULL, "x    y");
    expect("\r\nA\r\n", NULL, "\nA");
}

Test(jinja, expressions_and_filters) {
    expect("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 1 / 2 }} {{ 2 ** 10 }}", NULL,
           "7 3 -4 -2 0.5 1024");
    expect("{{ 'a' ~ 1 ~ none }} {{ [1, 'b', none, true] }} {{ {'k': 1.0} }}", NULL,
           "a1None [1, 'b', None, True] {'k': 1.0}");
    expect("{{ x | tojson }} {{ x | tojson(indent=2) }}", "{\"x\": {\"a\": [1, \"é\\n\"], \"b\": null}}",
           "{\"a\": [1, \"é\\n\"], \"b\": null} {\n  \"a\": [\n    1,\n    \"é\\n\"\n  ],\n  \"b\": null\n}");
    expect("{{ '  hi  ' | trim }}|{{ 'Hi There' | upper }}|{{ 'a,b,,c'.split(',') }}|{{ ['x','y'] | join('-') }}", NULL,
           "hi|HI THERE|['a', 'b', '', 'c']|x-y");
    expect("{{ u | default('d') }} {{ '' | default('d', true) }} {{ none is none }} {{ u is defined }}", NULL,
           "d d True False");
    expect("{{ 'héllo'[1:3] }} {{ [1,2,3][::-1] }} {{ 'abc'[-1] }} {{ 'x y'.title() }}", NULL, "él [3, 2, 1] c X Y");
    expect("{{ m | selectattr('r', 'equalto', 'u') | map(attribute='c') | list }}",
           "{\"m\": [{\"r\": \"u\", \"c\": 1}, {\"r\": \"a\", \"c\": 2}, {\"r\": \"u\", \"c\": 3}]}", "[1, 3]");
    expect("{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %}{{ d.items() | list | length }}",
           "{\"d\": {\"b\": 2, \"a\": 1}}", "a=1;b=2;2");
    expect("{{ 0.1 + 0.2 }} {{ 1e20 * 1.0 }} {{ 3 / 1 }} {{ 1.5e-7 }}", NULL, "0.30000000000000004 1e+20 3.0 1.5e-07");
}

Test(jinja, statements) {
    expect(
        "{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i is even %}{% set ns.n = ns.n + i %}{% endif %}"
        "{% endfor %}{{ ns.n }}",
        NULL, "6");
    expect("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% else %}none{% endfor %}",
           "{\"xs\": [\"a\", \"b\"]}", "1/2,2/2");
    expect("{% for x in [] %}x{% else %}none{% endfor %}", NULL, "none");
    expect(
        "{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}"
        "{{ i }}{% endfor %}",
        NULL, "02");
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", NULL, "[1B][23]");
    expect("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}", NULL, "<in>");
    expect("{% filter upper %}abc{% endfilter %}{% set x %}q{{ 1 }}{% endset %}{{ x }}", NULL, "ABCq1");
    expect("{% set y = 0 %}{% for i in range(3) %}{{ y }}{% set y = i + 10 %}{{ y }},{% endfor %}{{ y }}", NULL,
           "010,011,012,0");
    expect("{% for i in range(4) if i != 1 %}{{ loop.index0 }}{{ i }}{% endfor %}", NULL, "001223");
    expect("{{ strftime_now('%d %b %Y') }}", NULL, "26 Jul 2024");
}

Test(jinja, errors_name_line_and_column) {
    expect_error("a\n{{ x.y }}", NULL, TRI_STATUS_INVALID_ARGUMENT, "line 2, column 5: 'x' is undefined");
    expect_error("{% if x %}", NULL, TRI_STATUS_BAD_FORMAT, "block not closed: expected {% elif %}");
    expect_error("{{ x | nope }}", NULL, TRI_STATUS_BAD_FORMAT, "no filter named 'nope'");
    expect_error("{{ raise_exception('bad role') }}", NULL, TRI_STATUS_INVALID_ARGUMENT, "raise_exception: bad role");
    expect_error("{% include 'x' %}", NULL, TRI_STATUS_UNSUPPORTED, "{% include %} is not supported");
    expect_error("{{ [].append(1) }}", NULL, TRI_STATUS_INVALID_ARGUMENT, "unsafe");
    expect_error("{{ 'abc", NULL, TRI_STATUS_BAD_FORMAT, "unterminated string");
    expect_error("{{ (((((1 }}", NULL, TRI_STATUS_BAD_FORMAT, "");
}

Test(jinja, limits_stop_runaway_templates) {
    expect_error("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", NULL,
                 TRI_STATUS_BAD_FORMAT, "step limit");
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, TRI_STATUS_BAD_FORMAT,
                 "nested too deeply");
    expect_error("{% set s = 'xxxxxxxxxxxxxxxx' %}{% for i in range(100000) %}{{ s * 1000 }}{% endfor %}", NULL,
                 TRI_STATUS_BAD_FORMAT, "limit");
    char deep[2100];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[n++] = '[';
    for (int i = 0; i < 1000; i++) deep[n++] = ']';
    memcpy(deep + n, " }}", 4);
    expect_error(deep, NULL, TRI_STATUS_BAD_FORMAT, "nested too deeply");
}
