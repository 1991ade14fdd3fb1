// triforce-chat.c - a GTK 4 chat window over the public API of libtriforce, nothing else.
//
// The model loads in a worker thread behind a progress bar; each answer is generated in a worker
// thread and streamed into the window token by token, with tokens per second; Stop aborts the
// generation (tri_session_abort). The conversation stays in the session's cache between turns.
//
// Build it against an installed library as any application would:
//   cc triforce-chat.c $(pkg-config --cflags --libs triforce gtk4) -o triforce-chat
//
// usage: triforce-chat [--ctx N] [--n-predict N] [--temperature T] [--prompt TEXT]
//                      [--screenshot FILE.png] [--print] [--stop-after N] MODEL
// --prompt sends TEXT as soon as the model is loaded; with --screenshot the window is saved as a
// PNG once that answer is complete, and the program exits (how the test under Xvfb drives it);
// --print writes each answer to stdout as well; --stop-after N presses Stop once N tokens of an
// answer have arrived.
#include <gtk/gtk.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <triforce.h>

typedef struct chat {
    // options
    char *model_path;
    char *auto_prompt;
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
    gboolean chatml;             // the vocabulary has <|im_start|>: SmolLM2-style ChatML turns
    tri_stop_reason last_stop;   // of the previous answer: a turn cut short is closed first

    GThread *loader;
    atomic_bool closing;         // the window is gone: a load in progress is cancelled

    // the generation in progress
    GThread *worker;
    int n_emitted;               // tokens emitted, counted by the worker
    char *turn;                  // the user's text of this turn
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
    if (c->auto_prompt) send_turn(c, c->auto_prompt);
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
    c->last_stop = m->st == TRI_STATUS_OK ? m->stats.stop_reason : TRI_STOP_ERROR;
    if (c->print) {
        printf("%s\n", c->answer->str);
        fflush(stdout);
    }
    gtk_widget_set_sensitive(c->stop_button, FALSE);
    gtk_widget_set_sensitive(c->send, TRUE);
    gtk_widget_set_sensitive(c->entry, TRUE);
    gtk_widget_grab_focus(c->entry);
    // two frames' time for the last text to be laid out and drawn
    if (c->screenshot && c->auto_prompt) g_timeout_add(400, save_screenshot, c);
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
        int32_t id;
        int64_t n = 0;
        c->chatml = tri_tokenize(c->model, "<|im_start|>", 12, false, true, &id, 1, &n) == TRI_STATUS_OK && n == 1 &&
                    tri_token_is_special(c->model, id);
    } else {
        m->text = g_strdup(tri_last_error());
    }
    g_idle_add(on_loaded, m);
    return NULL;
}

static bool on_token(int32_t id, void *user) {
    chat *c = user;
    if (atomic_load(&c->stop)) return false;
    const char *text;
    size_t len;
    if (tri_detokenizer_push(c->detok, id, &text, &len) != TRI_STATUS_OK) return false;
    msg *m = msg_new(c);
    m->text = g_strndup(text, len);
    m->n_tokens = ++c->n_emitted;
    g_idle_add(on_text, m);
    return true;
}

// The turn as the model expects it: ChatML for models that have its tokens (SmolLM2-Instruct), as
// `offload-run generate --chat` wraps a prompt; else plain "User:" / "Assistant:" lines.
static char *format_turn(const chat *c, const char *text, bool first) {
    if (!c->chatml) return g_strdup_printf("%sUser: %s\nAssistant:", first ? "" : "\n", text);
    // after an answer that ended with <|im_end|> (its end-of-sequence), a newline; after one cut
    // short, the <|im_end|> it lacks
    const char *before = first ? "" : c->last_stop == TRI_STOP_EOS ? "\n" : "<|im_end|>\n";
    return g_strdup_printf("%s<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", before, text);
}

static gpointer generate_worker(gpointer data) {
    chat *c = data;
    msg *done = msg_new(c);
    int32_t *ids = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool first = tri_session_n_past(c->session) == 0;
        char *prompt = format_turn(c, c->turn, first);
        int64_t n = 0;
        done->st = tri_tokenize(c->model, prompt, strlen(prompt), first, true, NULL, 0, &n);
        if (done->st == TRI_STATUS_OK) {
            g_free(ids);
            ids = g_new(int32_t, n > 0 ? n : 1);
            done->st = tri_tokenize(c->model, prompt, strlen(prompt), first, true, ids, n, &n);
        }
        g_free(prompt);
        if (done->st != TRI_STATUS_OK) break;
        tri_generate_params gp = tri_generate_default_params();
        gp.n_predict = c->n_predict;
        gp.sampler.temperature = (float)c->temperature;
        gp.sampler.top_p = c->temperature > 0 ? 0.95f : 1.0f;
        gp.sampler.seed = (uint64_t)g_get_real_time();
        if (atomic_load(&c->stop)) {  // Stop pressed before the generation began
            done->stats.stop_reason = TRI_STOP_ABORT;
            break;
        }
        done->st = tri_generate(c->session, ids, (int32_t)n, &gp, on_token, c, &done->stats);
        // the conversation no longer fits the context: start a new one with this turn
        if (done->st == TRI_STATUS_INVALID_ARGUMENT && done->stats.n_prompt == 0 && done->stats.n_generated == 0 &&
            tri_session_n_past(c->session) > 0) {
            tri_session_reset(c->session);
            continue;
        }
        break;
    }
    if (done->st != TRI_STATUS_OK) {
        done->text = g_strdup(tri_last_error());
    } else {
        const char *text;
        size_t len;
        if (tri_detokenizer_flush(c->detok, &text, &len) == TRI_STATUS_OK) done->text = g_strndup(text, len);
    }
    g_free(ids);
    g_idle_add(on_done, done);
    return NULL;
}

// ---- the window ----

static void send_turn(chat *c, const char *text) {
    if (c->worker || !text[0]) return;
    g_free(c->turn);
    c->turn = g_strdup(text);
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
    chat c = {.ctx = 4096, .n_predict = 512, .last_stop = TRI_STOP_NONE};
    char **rest = NULL;
    GOptionEntry entries[] = {
        {"ctx", 0, 0, G_OPTION_ARG_INT, &c.ctx, "Context in tokens (0: the model's trained context)", "N"},
        {"n-predict", 'n', 0, G_OPTION_ARG_INT, &c.n_predict, "Tokens per answer at most", "N"},
        {"temperature", 't', 0, G_OPTION_ARG_DOUBLE, &c.temperature, "Sampling temperature (0: greedy)", "T"},
        {"prompt", 'p', 0, G_OPTION_ARG_STRING, &c.auto_prompt, "Send TEXT once the model is loaded", "TEXT"},
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
    g_free(c.turn);
    g_strfreev(rest);
    g_free(c.auto_prompt);
    g_free(c.screenshot);
    return status ? status : c.exit_code;
}
