#include "line_reader.hpp"

#include <clocale>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#ifdef AXENGINE_HAVE_LIBEDIT
#include <histedit.h>
#endif

namespace ax::cli {
namespace {

std::optional<std::string> plain_line(bool terminal) {
  if (terminal) std::cerr << "> " << std::flush;
  std::string line;
  if (!std::getline(std::cin, line)) return std::nullopt;
  return line;
}

#ifdef AXENGINE_HAVE_LIBEDIT
const char* prompt(EditLine*) { return "> "; }

// One EditLine over stdin, drawing on stderr, with an in-memory history of the session's lines.
class Editor {
 public:
  Editor() {
    // Multibyte characters (UTF-8 input) are edited as characters only under the user's LC_CTYPE; the rest of
    // the process keeps the "C" locale (numbers, iostreams).
    std::setlocale(LC_CTYPE, "");
    el_ = el_init("axengine", stdin, stderr, stderr);
    hist_ = history_init();
    if (!el_ || !hist_) return;
    HistEvent ev;
    history(hist_, &ev, H_SETSIZE, 1000);
    history(hist_, &ev, H_SETUNIQUE, 1);
    el_set(el_, EL_PROMPT, &prompt);
    el_set(el_, EL_EDITOR, "emacs");
    el_set(el_, EL_HIST, history, hist_);
    el_set(el_, EL_SIGNAL, 1);  // restore the terminal on a signal, and follow window size changes
    el_source(el_, nullptr);    // ~/.editrc, as other libedit programs read it
  }
  ~Editor() {
    if (el_) el_end(el_);
    if (hist_) history_end(hist_);
  }
  Editor(const Editor&) = delete;
  Editor& operator=(const Editor&) = delete;

  bool ok() const { return el_ && hist_; }

  std::optional<std::string> line() {
    int count = 0;
    const char* text = el_gets(el_, &count);
    if (!text || count <= 0) return std::nullopt;  // end of input (^D on an empty line)
    std::string out(text, static_cast<std::size_t>(count));
    if (!out.empty() && out.back() == '\n') out.pop_back();
    if (!out.empty()) {
      HistEvent ev;
      history(hist_, &ev, H_ENTER, out.c_str());
    }
    return out;
  }

 private:
  EditLine* el_ = nullptr;
  History* hist_ = nullptr;
};
#endif

}  // namespace

ReadLine make_line_reader(bool terminal) {
#ifdef AXENGINE_HAVE_LIBEDIT
  if (terminal) {
    auto editor = std::make_shared<Editor>();
    if (editor->ok()) return [editor] { return editor->line(); };
  }
#endif
  return [terminal] { return plain_line(terminal); };
}

}  // namespace ax::cli
