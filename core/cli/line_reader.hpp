// Where `axengine chat` reads its user's lines from. On a terminal: libedit (Debian's libedit-dev, BSD
// licensed), so the arrow keys move in the line and through the session's earlier lines, ^R searches them, and
// ~/.editrc applies, with the "> " prompt and the editing on stderr (stdout carries only the answers). Elsewhere
// (a pipe, a file), or in a build without libedit: plain lines from std::cin, and on a terminal a "> " prompt.
#pragma once
#include "axengine/generation.hpp"

namespace ax::cli {

// `terminal`: stdin is a terminal.
ReadLine make_line_reader(bool terminal);

}  // namespace ax::cli
