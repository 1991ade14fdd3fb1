#!/usr/bin/env bash
# test-chat-gtk.sh APP CLI SHOT_OUT plain|sanitized
#
# Runs the GTK chat window (APP) under Xvfb on SmolLM2 ($TRI_TEST_MODEL): it loads the model,
# answers one prompt greedily, streamed, then saves its window as a PNG (copied to SHOT_OUT) and
# exits. Checks that
#   1. the answer it streamed is the text `offload-run generate --chat` (CLI) gives for the same
#      prompt, model and length, greedy and without penalties (--temp 0 --repeat-penalty 1: the CLI
#      samples a chat with the chat settings by default);
#   2. the screenshot shows it: OCR (tesseract) finds the prompt, at least 80% of the answer's
#      words, and the tokens-per-second figure;
#   3. Stop, pressed (--stop-after) once 8 tokens arrived, ends the answer early: a shorter prefix
#      of the same answer, and the window says it stopped;
#   4. a second turn, answered from the conversation kept in the cache, is what `offload-run chat`
#      answers to the same two lines.
# Exit 77 (skipped), saying why, without GTK 4 (the build found none), Xvfb, tesseract or the model.
set -euo pipefail
app=$1 cli=$2 shot_out=$3 kind=$4
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$kind" != sanitized ] || skip "sanitizer build (GTK's allocations kept until exit are not ours to chase)"
[ "$app" != none ] || skip "GTK 4 was not found when the build was configured: install libgtk-4-dev (scripts/install-deps.sh) and reconfigure"
command -v xvfb-run >/dev/null || skip "xvfb-run not found: install xvfb and xauth (scripts/install-deps.sh)"
command -v tesseract >/dev/null || skip "tesseract not found: install tesseract-ocr and tesseract-ocr-eng (scripts/install-deps.sh)"
model=${TRI_TEST_MODEL:-}
[ -n "$model" ] && [ -f "$model" ] || skip "TRI_TEST_MODEL is not set (scripts/get-model.sh fetches SmolLM2-135M-Instruct; scripts/test.sh sets it)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tri-chat.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prompt="Write a short poem about the sea."
n=48

# ---- the window, under Xvfb ----
# GTK's cairo renderer: a virtual framebuffer has no GL
GSK_RENDERER=cairo GDK_BACKEND=x11 NO_AT_BRIDGE=1 \
  timeout 240 xvfb-run -a -s "-screen 0 1024x768x24" \
  "$app" --prompt "$prompt" -n "$n" --print --screenshot "$tmp/shot.png" "$model" >"$tmp/app.txt" 2>"$tmp/app.err" ||
  { cat "$tmp/app.err"; fail "the chat window exited with status $?"; }
[ -s "$tmp/shot.png" ] || { cat "$tmp/app.err"; fail "no screenshot"; }
mkdir -p "$(dirname "$shot_out")"
cp "$tmp/shot.png" "$shot_out"
echo "screenshot: $shot_out"
echo "streamed answer:"; cat "$tmp/app.txt"

# ---- 1. the same text as the CLI ----
"$cli" generate -m "$model" --chat -p "$prompt" -n "$n" --temp 0 --repeat-penalty 1 >"$tmp/cli.txt" 2>"$tmp/cli.err" ||
  { cat "$tmp/cli.err"; fail "offload-run generate"; }
norm() { tr -s ' \n\t' ' ' <"$1" | sed 's/^ //; s/ $//'; }
[ "$(norm "$tmp/app.txt")" = "$(norm "$tmp/cli.txt")" ] ||
  { echo "CLI:"; cat "$tmp/cli.txt"; fail "the window's answer is not the CLI's"; }

# ---- 2. the screenshot shows it ----
tesseract "$tmp/shot.png" "$tmp/ocr" >/dev/null 2>&1 || fail "tesseract"
echo "OCR:"; cat "$tmp/ocr.txt"
words() { tr 'A-Z' 'a-z' <"$1" | tr -c 'a-z0-9\n' ' ' | tr ' ' '\n' | grep -E '^[a-z]{4,}$' || true; }
words "$tmp/ocr.txt" | sort -u >"$tmp/ocr.words"
words "$tmp/cli.txt" | sort -u >"$tmp/answer.words"
total=$(wc -l <"$tmp/answer.words")
found=$(comm -12 "$tmp/ocr.words" "$tmp/answer.words" | wc -l)
echo "answer words found by OCR: $found of $total"
[ "$total" -ge 5 ] || fail "the answer has too few words to check ($total)"
[ $((found * 100)) -ge $((total * 80)) ] || fail "OCR finds $found of the answer's $total words in the screenshot"
grep -qi "poem about the sea" "$tmp/ocr.txt" || fail "OCR does not find the prompt"
grep -Eq "[0-9]+ tokens, [0-9.]+ tok/s" "$tmp/ocr.txt" || fail "OCR does not find the tokens/s figure"

# ---- 3. Stop ----
GSK_RENDERER=cairo GDK_BACKEND=x11 NO_AT_BRIDGE=1 \
  timeout 240 xvfb-run -a -s "-screen 0 1024x768x24" \
  "$app" --prompt "$prompt" -n "$n" --print --stop-after 8 --screenshot "$tmp/stop.png" "$model" \
  >"$tmp/stop.txt" 2>"$tmp/stop.err" || { cat "$tmp/stop.err"; fail "the chat window (Stop) exited with status $?"; }
echo "stopped answer:"; cat "$tmp/stop.txt"
full=$(norm "$tmp/cli.txt") part=$(norm "$tmp/stop.txt")
[ -n "$part" ] && [ "${#part}" -lt "${#full}" ] && [ "${full:0:${#part}}" = "$part" ] ||
  fail "the stopped answer is not a shorter prefix of the whole one"
tesseract "$tmp/stop.png" "$tmp/stop-ocr" >/dev/null 2>&1 || fail "tesseract"
grep -Eq "[0-9]+ tokens, [0-9.]+ tok/s \(stopped\)" "$tmp/stop-ocr.txt" ||
  { cat "$tmp/stop-ocr.txt"; fail "the window does not say the answer stopped"; }

# ---- 4. two turns ----
second="What is the capital of France?"
GSK_RENDERER=cairo GDK_BACKEND=x11 NO_AT_BRIDGE=1 \
  timeout 240 xvfb-run -a -s "-screen 0 1024x768x24" \
  "$app" --prompt "$prompt" --prompt "$second" -n 24 --print --screenshot "$tmp/two.png" "$model" \
  >"$tmp/two.txt" 2>"$tmp/two.err" || { cat "$tmp/two.err"; fail "the chat window (two turns) exited with status $?"; }
printf '%s\n%s\n' "$prompt" "$second" | "$cli" chat -m "$model" -n 24 --temp 0 --repeat-penalty 1 >"$tmp/cli-two.txt" 2>"$tmp/cli-two.err" ||
  { cat "$tmp/cli-two.err"; fail "offload-run chat"; }
echo "two turns:"; cat "$tmp/two.txt"
[ "$(norm "$tmp/two.txt")" = "$(norm "$tmp/cli-two.txt")" ] ||
  { echo "offload-run chat:"; cat "$tmp/cli-two.txt"; fail "the window's two answers are not offload-run chat's"; }
echo "PASS"
