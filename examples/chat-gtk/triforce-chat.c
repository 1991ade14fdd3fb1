// triforce-chat.c - a GTK 4 chat window over the public API of libtriforce, nothing else.
//
// The model loads in a worker thread behind a progress bar; each answer is generated in a worker
// thread and streamed into the window token by token, with tokens per second; Stop aborts the
// generation (tri_session_abort). Each turn renders the whole conversation with the model's own
// chat template (tri_chat_apply), as `offload-run chat` does, and prefills only the tokens past
// what the session's cache already holds: the conversation stays in the cache between turns.
//
// Build it against an installed library as any application would:
//   cc triforce-chat.c $(pkg-config --cflags --libs triforce gtk4) -o triforce-chat
//
// usage: triforce-chat [--ctx N] [--n-predict N] [--temperature T] [--prompt TEXT]...
//                      [--screenshot FILE.png] [--print] [--stop-after N] MODEL
// --prompt sends TEXT as soon as the model is loaded (several: each once the previous answer is
// complete); with --screenshot the window is saved as a PNG once the last answer is complete, and
// the program exits (how the test under Xvfb drives it);
// --print writes each answer to stdout as well; --stop-after N presses Stop once N tokens of an
// answer have arrived (the worker waits at that token for the click, so the test cannot race).
#include <gtk/gtk.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <triforce.h>

typedef struct chat {
    // options
    char *model_path;
    char **auto_prompts;         // --prompt, in order (NULL-terminated)
    int next_prompt;             // the next of them to send
    char *screenshot;
    int ctx, n_predict;
    int stop_after;              // --stop-after: press Stop when this many tokens have arrived
    double temperature;
    gboolean print;
    int exit_code;

    // widgets
    GtkApplication *gapp;
    GtkWidget *window, *progress, *status, *view, *entry, *send, *stop_button;
    GtkTextBuffer *buf;

    // the library's objects: made by the load worker, then used by one generation worker at a time
    tri_model *model;
    tri_session *session;
    tri_detokenizer *detok;
    gboolean templated;          // the model has a chat template of a known format; else plain
                                 // "User:" / "Assistant:" lines
    int32_t stop_ids[16];        // the tokens that end an assistant's turn (tri_chat_stop_tokens)
    int32_t n_stop_ids;

    // the conversation: owned by the GTK thread while no worker runs, by the worker while it does
    tri_chat_message *msgs;      // contents g_malloc'd, roles static
    size_t n_msgs, cap_msgs;
    int32_t *cached;             // the tokens in the session's cache, in order (g_malloc'd)
    int32_t n_cached;
    int32_t *answer_ids;         // the tokens of the answer in progress (g_malloc'd)
    int32_t n_answer_ids, cap_answer_ids;
    GString *answer_text;        // its text as decoded by the worker

    GThread *loader;
    atomic_bool closing;         // the window is gone: a load in progress is cancelled

    // the generation in progress
    GThread *worker;
    int n_emitted;               // tokens emitted, counted by the worker
    atomic_bool stop;            // Stop was pressed (also before the worker reached tri_generate)
    gint64 t_first;              // monotonic us of the first token
    int n_tokens;
    GString *answer;
} chat;

// ---- messages from the workers, run on the GTK main loop ----

typedef struct msg {
    chat *c;
    float fraction;
    int n_tokens;
    char *text;
    tri_status st;
    tri_generate_stats stats;
} msg;

static msg *msg_new(chat *c) {
    msg *m = g_new0(msg, 1);
    m->c = c;
    return m;
}

static void msg_free(msg *m) {
    g_free(m->text);
    g_free(m);
}

static void set_status(chat *c, const char *text) { gtk_label_set_text(GTK_LABEL(c->status), text); }

static void append(chat *c, const char *text, const char *tag) {
    GtkTextIter end;
    gtk_text_buffer_get_end_iter(c->buf, &end);
    gtk_text_buffer_insert_with_tags_by_name(c->buf, &end, text, -1, "big", tag, NULL);
    gtk_text_buffer_get_end_iter(c->buf, &end);
    GtkTextMark *mark = gtk_text_buffer_get_mark(c->buf, "end");
    gtk_text_buffer_move_mark(c->buf, mark, &end);
    gtk_text_view_scroll_mark_onscreen(GTK_TEXT_VIEW(c->view), mark);
}

static gboolean on_progress(gpointer data) {
    msg *m = data;
    gtk_progress_bar_set_fraction(GTK_PROGRESS_BAR(m->c->progress), m->fraction);
    msg_free(m);
    return G_SOURCE_REMOVE;
}

static void send_turn(chat *c, const char *text);

static gboolean on_loaded(gpointer data) {
    msg *m = data;
    chat *c = m->c;
    gtk_widget_set_visible(c->progress, FALSE);
    if (m->st != TRI_STATUS_OK) {
        char *s = g_strdup_printf("Cannot load %s: %s", c->model_path, m->text);
        set_status(c, s);
        g_free(s);
        c->exit_code = 1;
        if (c->screenshot) g_application_quit(G_APPLICATION(c->gapp));
        msg_free(m);
        return G_SOURCE_REMOVE;
    }
    tri_model_info info;
    tri_model_get_info(c->model, &info);
    char *s = g_strdup_printf("%s: %d layers, %d tokens of context, on %s", info.name[0] ? info.name : c->model_path,
                              info.config.n_layer, tri_session_n_ctx(c->session), tri_session_device(c->session));
    set_status(c, s);
    g_free(s);
    gtk_widget_set_sensitive(c->entry, TRUE);
    gtk_widget_set_sensitive(c->send, TRUE);
    gtk_widget_grab_focus(c->entry);
    if (c->auto_prompts && c->auto_prompts[0]) send_turn(c, c->auto_prompts[c->next_prompt++]);
    msg_free(m);
    return G_SOURCE_REMOVE;
}

static void show_rate(chat *c, const char *tail) {
    double s = c->n_tokens > 1 ? (double)(g_get_monotonic_time() - c->t_first) / 1e6 : 0;
    char *t = s > 0 ? g_strdup_printf("%d tokens, %.1f tok/s%s", c->n_tokens, (c->n_tokens - 1) / s, tail)
                    : g_strdup_printf("%d tokens%s", c->n_tokens, tail);
    set_status(c, t);
    g_free(t);
}

static gboolean on_text(gpointer data) {
    msg *m = data;
    chat *c = m->c;
    if (c->n_tokens == 0) c->t_first = g_get_monotonic_time();
    c->n_tokens = m->n_tokens;
    if (m->text && m->text[0]) {
        append(c, m->text, "bot");
        g_string_append(c->answer, m->text);
    }
    show_rate(c, "");
    if (c->stop_after > 0 && c->n_tokens >= c->stop_after && gtk_widget_get_sensitive(c->stop_button))
        gtk_widget_activate(c->stop_button);  // as a click would
    msg_free(m);
    return G_SOURCE_REMOVE;
}

// Saves what the window shows as a PNG, through GTK's own rendering of it.
static gboolean save_screenshot(gpointer data) {
    chat *c = data;
    int w = gtk_widget_get_width(c->window), h = gtk_widget_get_height(c->window);
    GdkPaintable *paintable = gtk_widget_paintable_new(c->window);
    GtkSnapshot *snap = gtk_snapshot_new();
    gdk_paintable_snapshot(paintable, snap, w, h);
    GskRenderNode *node = gtk_snapshot_free_to_node(snap);
    gboolean ok = FALSE;
    if (node) {
        GskRenderer *r = gtk_native_get_renderer(GTK_NATIVE(c->window));
        graphene_rect_t area = GRAPHENE_RECT_INIT(0, 0, (float)w, (float)h);
        GdkTexture *tex = gsk_renderer_render_texture(r, node, &area);
        ok = gdk_texture_save_to_png(tex, c->screenshot);
        g_object_unref(tex);
        gsk_render_node_unref(node);
    }
    g_object_unref(paintable);
    if (!ok) {
        fprintf(stderr, "triforce-chat: cannot write %s\n", c->screenshot);
        c->exit_code = 1;
    }
    g_application_quit(G_APPLICATION(c->gapp));
    return G_SOURCE_REMOVE;
}

static gboolean on_done(gpointer data) {
    msg *m = data;
    chat *c = m->c;
    g_thread_join(c->worker);
    c->worker = NULL;
    if (m->st == TRI_STATUS_OK && m->text && m->text[0]) {  // what the detokenizer held back
        append(c, m->text, "bot");
        g_string_append(c->answer, m->text);
    }
    append(c, "\n\n", NULL);
    if (m->st != TRI_STATUS_OK) {
        char *s = g_strdup_printf("Error: %s", m->text ? m->text : tri_status_str(m->st));
        set_status(c, s);
        g_free(s);
        c->exit_code = 1;
    } else {
        const char *why = m->stats.stop_reason == TRI_STOP_ABORT      ? " (stopped)"
                          : m->stats.stop_reason == TRI_STOP_CALLBACK ? " (stopped)"
                          : m->stats.stop_reason == TRI_STOP_EOS      ? ""
                          : m->stats.stop_reason == TRI_STOP_STRING   ? ""
                          : m->stats.stop_reason == TRI_STOP_LENGTH   ? " (length limit)"
                                                                      : " (context full)";
        c->n_tokens = m->stats.n_generated;
        double s = m->stats.decode_seconds;
        char *t = s > 0 && c->n_tokens > 1
                      ? g_strdup_printf("%d tokens, %.1f tok/s%s", c->n_tokens, (c->n_tokens - 1) / s, why)
                      : g_strdup_printf("%d tokens%s", c->n_tokens, why);
        set_status(c, t);
        g_free(t);
    }
    if (c->print) {
        printf("%s\n", c->answer->str);
        fflush(stdout);
    }
    gtk_widget_set_sensitive(c->stop_button, FALSE);
    gtk_widget_set_sensitive(c->send, TRUE);
    gtk_widget_set_sensitive(c->entry, TRUE);
    gtk_widget_grab_focus(c->entry);
    // the next --prompt, or the screenshot after the last answer, two frames' time for its text
    // to be laid out and drawn
    if (c->auto_prompts && c->auto_prompts[c->next_prompt] && m->st == TRI_STATUS_OK)
        send_turn(c, c->auto_prompts[c->next_prompt++]);
    else if (c->screenshot && c->auto_prompts && c->auto_prompts[0])
        g_timeout_add(400, save_screenshot, c);
    msg_free(m);
    return G_SOURCE_REMOVE;
}

// ---- workers ----

static bool load_progress(float fraction, void *user) {
    chat *c = user;
    msg *m = msg_new(c);
    m->fraction = fraction;
    g_idle_add(on_progress, m);
    return !atomic_load(&c->closing);
}

static gpointer load_worker(gpointer data) {
    chat *c = data;
    msg *m = msg_new(c);
    tri_model_params mp = tri_model_default_params();
    mp.populate = true;  // read the weights now, behind the progress bar, not during the first answer
    mp.progress = load_progress;
    mp.progress_user = c;
    tri_session_params sp = tri_session_default_params();
    sp.n_ctx = c->ctx;
    if ((m->st = tri_model_load(c->model_path, &mp, &c->model)) == TRI_STATUS_OK &&
        (m->st = tri_session_create(c->model, &sp, &c->session)) == TRI_STATUS_OK &&
        (m->st = tri_detokenizer_create(c->model, false, &c->detok)) == TRI_STATUS_OK) {
        tri_chat_format f;
        c->templated = tri_chat_model_format(c->model, &f) == TRI_STATUS_OK;
        if (!c->templated || tri_chat_stop_tokens(c->model, c->stop_ids, 16, &c->n_stop_ids) != TRI_STATUS_OK)
            c->n_stop_ids = 0;
        if (c->n_stop_ids > 16) c->n_stop_ids = 16;
    } else {
        m->text = g_strdup(tri_last_error());
    }
    g_idle_add(on_loaded, m);
    return NULL;
}

static bool on_token(int32_t id, void *user) {
    chat *c = user;
    if (atomic_load(&c->stop)) return false;
    if (c->n_answer_ids == c->cap_answer_ids) {
        c->cap_answer_ids = c->cap_answer_ids ? 2 * c->cap_answer_ids : 256;
        c->answer_ids = g_renew(int32_t, c->answer_ids, c->cap_answer_ids);
    }
    c->answer_ids[c->n_answer_ids++] = id;
    const char *text;
    size_t len;
    if (tri_detokenizer_push(c->detok, id, &text, &len) != TRI_STATUS_OK) return false;
    g_string_append_len(c->answer_text, text, (gssize)len);
    msg *m = msg_new(c);
    m->text = g_strndup(text, len);
    m->n_tokens = ++c->n_emitted;
    g_idle_add(on_text, m);
    // --stop-after: the worker waits at the Nth token until the window has shown it and pressed
    // Stop, so the test does not race the main loop (a loaded machine draws slower than we decode)
    if (c->stop_after > 0 && c->n_emitted == c->stop_after)
        for (int ms = 0; ms < 60000 && !atomic_load(&c->stop) && !atomic_load(&c->closing); ms++) g_usleep(1000);
    return !atomic_load(&c->stop);
}

static void conv_add(chat *c, const char *role, const char *content) {
    if (c->n_msgs == c->cap_msgs) {
        c->cap_msgs = c->cap_msgs ? 2 * c->cap_msgs : 16;
        c->msgs = g_renew(tri_chat_message, c->msgs, c->cap_msgs);
    }
    c->msgs[c->n_msgs].role = role;
    c->msgs[c->n_msgs].content = g_strdup(content);
    c->n_msgs++;
}

// Forgets every message but the last n (a conversation that no longer fits the context).
static void conv_keep_last(chat *c, size_t n) {
    size_t drop = c->n_msgs - n;
    for (size_t i = 0; i < drop; i++) g_free((char *)c->msgs[i].content);
    memmove(c->msgs, c->msgs + drop, n * sizeof *c->msgs);
    c->n_msgs = n;
}

// The whole conversation as the model expects it, ending with the header of the assistant's
// turn: the model's chat template where it has one of a known format, else plain "User:" /
// "Assistant:" lines. NULL with *st set on failure.
static char *render(const chat *c, tri_status *st) {
    if (!c->templated) {
        GString *g = g_string_new(NULL);
        for (size_t i = 0; i < c->n_msgs; i++)
            g_string_append_printf(g, "%s%s: %s", i ? "\n" : "",
                                   strcmp(c->msgs[i].role, "user") == 0 ? "User" : "Assistant", c->msgs[i].content);
        g_string_append(g, "\nAssistant:");
        *st = TRI_STATUS_OK;
        return g_string_free(g, FALSE);
    }
    size_t need = 0;
    *st = tri_chat_apply(c->model, TRI_CHAT_FORMAT_AUTO, c->msgs, c->n_msgs, true, NULL, 0, &need);
    if (*st != TRI_STATUS_OK) return NULL;
    char *text = g_malloc(need + 1);
    *st = tri_chat_apply(c->model, TRI_CHAT_FORMAT_AUTO, c->msgs, c->n_msgs, true, text, need + 1, &need);
    if (*st != TRI_STATUS_OK) {
        g_free(text);
        return NULL;
    }
    return text;
}

// The conversation as tokens: a rendered template carries its BOS as text; plain lines get the
// tokenizer's own.
static int32_t *render_ids(const chat *c, int32_t *n_out, tri_status *st) {
    char *text = render(c, st);
    if (!text) return NULL;
    int64_t n = 0;
    int32_t *ids = NULL;
    bool add_special = !c->templated;
    *st = tri_tokenize(c->model, text, strlen(text), add_special, true, NULL, 0, &n);
    if (*st == TRI_STATUS_OK) {
        ids = g_new(int32_t, n > 0 ? n : 1);
        *st = tri_tokenize(c->model, text, strlen(text), add_special, true, ids, n, &n);
    }
    g_free(text);
    if (*st != TRI_STATUS_OK) {
        g_free(ids);
        return NULL;
    }
    *n_out = (int32_t)n;
    return ids;
}

static gpointer generate_worker(gpointer data) {
    chat *c = data;
    msg *done = msg_new(c);
    int32_t *ids = NULL, n_ids = 0, keep = 0;
    bool ran = false;
    for (int attempt = 0; attempt < 2; attempt++) {
        g_free(ids);
        if (!(ids = render_ids(c, &n_ids, &done->st))) break;
        // what the cache already holds of it: the longest common prefix, at least one token to run
        int32_t n_past = tri_session_n_past(c->session);
        keep = 0;
        while (keep < n_past && keep < c->n_cached && keep < n_ids && c->cached[keep] == ids[keep]) keep++;
        if (keep == n_ids) keep--;
        int32_t room = tri_session_n_ctx(c->session) - n_ids;
        if (room < 1) {  // the conversation no longer fits: start a new one with this turn
            if (attempt == 0 && c->n_msgs > 1) {
                conv_keep_last(c, 1);
                continue;
            }
            done->st = TRI_STATUS_INVALID_ARGUMENT;
            done->text = g_strdup_printf("the message (%d tokens) does not fit the context of %d tokens", n_ids,
                                         tri_session_n_ctx(c->session));
            break;
        }
        if ((done->st = tri_session_truncate(c->session, keep)) != TRI_STATUS_OK) break;
        c->n_cached = keep;  // what the cache holds of the conversation from here on, until the answer
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = c->n_predict > 0 && c->n_predict < room ? c->n_predict : room;
        gp.sampler.temperature = (float)c->temperature;
        gp.sampler.top_p = c->temperature > 0 ? 0.95f : 1.0f;
        gp.sampler.seed = (uint64_t)g_get_real_time();
        gp.stop_tokens = c->stop_ids;
        gp.n_stop_tokens = c->n_stop_ids;
        if (atomic_load(&c->stop)) {  // Stop pressed before the generation began
            done->stats.stop_reason = TRI_STOP_ABORT;
            break;
        }
        c->n_answer_ids = 0;
        g_string_truncate(c->answer_text, 0);
        done->st = tri_generate(c->session, ids + keep, n_ids - keep, &gp, on_token, c, &done->stats);
        ran = done->st == TRI_STATUS_OK;
        break;
    }
    const char *text;
    size_t len;
    if (tri_detokenizer_flush(c->detok, &text, &len) == TRI_STATUS_OK && ran) {  // else dropped
        done->text = g_strndup(text, len);
        g_string_append_len(c->answer_text, text, (gssize)len);
    }
    if (done->st != TRI_STATUS_OK) {
        if (!done->text) done->text = g_strdup(tri_last_error());
    } else if (ran) {
        // the cache now holds the rendering and the answer's tokens (the last one not yet run),
        // and the conversation the answer as written; an unanswered question is replaced by the
        // next one (send_turn)
        g_free(c->cached);
        c->cached = g_new(int32_t, n_ids + c->n_answer_ids + 1);
        memcpy(c->cached, ids, (size_t)n_ids * sizeof *ids);
        memcpy(c->cached + n_ids, c->answer_ids, (size_t)c->n_answer_ids * sizeof *ids);
        c->n_cached = n_ids + c->n_answer_ids;
        conv_add(c, "assistant", c->answer_text->str);
    }
    g_free(ids);
    g_idle_add(on_done, done);
    return NULL;
}

// ---- the window ----

static void send_turn(chat *c, const char *text) {
    if (c->worker || !text[0]) return;
    // a question left unanswered (an error, or Stop before the answer began) is replaced
    if (c->n_msgs > 0 && strcmp(c->msgs[c->n_msgs - 1].role, "user") == 0) {
        g_free((char *)c->msgs[c->n_msgs - 1].content);
        c->n_msgs--;
    }
    conv_add(c, "user", text);
    append(c, "You: ", "user");
    append(c, text, "user");
    append(c, "\n", NULL);
    g_string_truncate(c->answer, 0);
    c->n_tokens = 0;
    c->n_emitted = 0;
    atomic_store(&c->stop, false);
    gtk_widget_set_sensitive(c->send, FALSE);
    gtk_widget_set_sensitive(c->entry, FALSE);
    gtk_widget_set_sensitive(c->stop_button, TRUE);
    set_status(c, "Thinking...");
    c->worker = g_thread_new("generate", generate_worker, c);
}

static void on_send(GtkWidget *w, gpointer data) {
    (void)w;
    chat *c = data;
    GtkEntryBuffer *eb = gtk_entry_get_buffer(GTK_ENTRY(c->entry));
    char *text = g_strdup(gtk_entry_buffer_get_text(eb));
    gtk_entry_buffer_set_text(eb, "", 0);
    send_turn(c, g_strstrip(text));
    g_free(text);
}

static void on_stop(GtkWidget *w, gpointer data) {
    (void)w;
    chat *c = data;
    atomic_store(&c->stop, true);        // an answer not yet started never starts
    if (c->session) tri_session_abort(c->session);  // one in progress stops after its token
}

static void on_activate(GtkApplication *gapp, gpointer data) {
    chat *c = data;
    c->window = gtk_application_window_new(gapp);
    gtk_window_set_title(GTK_WINDOW(c->window), "triforce chat");
    gtk_window_set_default_size(GTK_WINDOW(c->window), 900, 640);

    GtkWidget *box = gtk_box_new(GTK_ORIENTATION_VERTICAL, 8);
    gtk_widget_set_margin_start(box, 12);
    gtk_widget_set_margin_end(box, 12);
    gtk_widget_set_margin_top(box, 12);
    gtk_widget_set_margin_bottom(box, 12);

    c->progress = gtk_progress_bar_new();
    gtk_progress_bar_set_show_text(GTK_PROGRESS_BAR(c->progress), TRUE);
    gtk_progress_bar_set_text(GTK_PROGRESS_BAR(c->progress), "Loading the model");
    gtk_box_append(GTK_BOX(box), c->progress);

    c->view = gtk_text_view_new();
    gtk_text_view_set_editable(GTK_TEXT_VIEW(c->view), FALSE);
    gtk_text_view_set_cursor_visible(GTK_TEXT_VIEW(c->view), FALSE);
    gtk_text_view_set_wrap_mode(GTK_TEXT_VIEW(c->view), GTK_WRAP_WORD_CHAR);
    gtk_text_view_set_left_margin(GTK_TEXT_VIEW(c->view), 8);
    gtk_text_view_set_right_margin(GTK_TEXT_VIEW(c->view), 8);
    c->buf = gtk_text_view_get_buffer(GTK_TEXT_VIEW(c->view));
    gtk_text_buffer_create_tag(c->buf, "big", "size-points", 15.0, NULL);
    gtk_text_buffer_create_tag(c->buf, "user", "weight", PANGO_WEIGHT_BOLD, NULL);
    gtk_text_buffer_create_tag(c->buf, "bot", "foreground", "#1a3d6e", NULL);
    GtkTextIter end;
    gtk_text_buffer_get_end_iter(c->buf, &end);
    gtk_text_buffer_create_mark(c->buf, "end", &end, FALSE);
    GtkWidget *scroll = gtk_scrolled_window_new();
    gtk_scrolled_window_set_child(GTK_SCROLLED_WINDOW(scroll), c->view);
    gtk_widget_set_vexpand(scroll, TRUE);
    gtk_box_append(GTK_BOX(box), scroll);

    GtkWidget *row = gtk_box_new(GTK_ORIENTATION_HORIZONTAL, 8);
    c->entry = gtk_entry_new();
    gtk_entry_set_placeholder_text(GTK_ENTRY(c->entry), "Ask something");
    gtk_widget_set_hexpand(c->entry, TRUE);
    g_signal_connect(c->entry, "activate", G_CALLBACK(on_send), c);
    c->send = gtk_button_new_with_label("Send");
    g_signal_connect(c->send, "clicked", G_CALLBACK(on_send), c);
    c->stop_button = gtk_button_new_with_label("Stop");
    g_signal_connect(c->stop_button, "clicked", G_CALLBACK(on_stop), c);
    gtk_box_append(GTK_BOX(row), c->entry);
    gtk_box_append(GTK_BOX(row), c->send);
    gtk_box_append(GTK_BOX(row), c->stop_button);
    gtk_box_append(GTK_BOX(box), row);
    gtk_widget_set_sensitive(c->entry, FALSE);
    gtk_widget_set_sensitive(c->send, FALSE);
    gtk_widget_set_sensitive(c->stop_button, FALSE);

    c->status = gtk_label_new("Loading...");
    gtk_label_set_xalign(GTK_LABEL(c->status), 0);
    gtk_box_append(GTK_BOX(box), c->status);

    gtk_window_set_child(GTK_WINDOW(c->window), box);
    gtk_window_present(GTK_WINDOW(c->window));
    c->loader = g_thread_new("load", load_worker, c);
}

int main(int argc, char **argv) {
    chat c = {.ctx = 4096, .n_predict = 512};
    char **rest = NULL;
    GOptionEntry entries[] = {
        {"ctx", 0, 0, G_OPTION_ARG_INT, &c.ctx, "Context in tokens (0: the model's trained context)", "N"},
        {"n-predict", 'n', 0, G_OPTION_ARG_INT, &c.n_predict, "Tokens per answer at most", "N"},
        {"temperature", 't', 0, G_OPTION_ARG_DOUBLE, &c.temperature, "Sampling temperature (0: greedy)", "T"},
        {"prompt", 'p', 0, G_OPTION_ARG_STRING_ARRAY, &c.auto_prompts,
         "Send TEXT once the model is loaded (repeatable: each after the previous answer)", "TEXT"},
        {"screenshot", 0, 0, G_OPTION_ARG_FILENAME, &c.screenshot,
         "With --prompt: save the window as a PNG after the answer, then exit", "FILE"},
        {"print", 0, 0, G_OPTION_ARG_NONE, &c.print, "Write each answer to stdout too", NULL},
        {"stop-after", 0, 0, G_OPTION_ARG_INT, &c.stop_after, "Press Stop once N tokens of an answer arrived (tests)",
         "N"},
        {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &rest, NULL, "MODEL"},
        {NULL, 0, 0, 0, NULL, NULL, NULL},
    };
    GError *err = NULL;
    GOptionContext *oc = g_option_context_new("MODEL - chat with a model in a window");
    g_option_context_add_main_entries(oc, entries, NULL);
    if (!g_option_context_parse(oc, &argc, &argv, &err) || !rest || !rest[0] || rest[1]) {
        fprintf(stderr, "triforce-chat: %s\n", err ? err->message : "one MODEL path expected (--help)");
        return 2;
    }
    g_option_context_free(oc);
    c.model_path = rest[0];
    c.answer = g_string_new(NULL);
    c.answer_text = g_string_new(NULL);

    c.gapp = gtk_application_new("org.triforce.Chat", G_APPLICATION_NON_UNIQUE);
    g_signal_connect(c.gapp, "activate", G_CALLBACK(on_activate), &c);
    int status = g_application_run(G_APPLICATION(c.gapp), 1, argv);  // options parsed above
    atomic_store(&c.closing, true);
    if (c.loader) g_thread_join(c.loader);  // a load in progress is cancelled by its next report
    if (c.worker) {                          // closed while answering: stop, then wait
        atomic_store(&c.stop, true);
        tri_session_abort(c.session);
        g_thread_join(c.worker);
    }
    g_object_unref(c.gapp);
    tri_detokenizer_free(c.detok);
    tri_session_free(c.session);
    tri_model_free(c.model);
    g_string_free(c.answer, TRUE);
    g_string_free(c.answer_text, TRUE);
    for (size_t i = 0; i < c.n_msgs; i++) g_free((char *)c.msgs[i].content);
    g_free(c.msgs);
    g_free(c.cached);
    g_free(c.answer_ids);
    g_strfreev(rest);
    g_strfreev(c.auto_prompts);
    g_free(c.screenshot);
    return status ? status : c.exit_code;
}
