"""The function-calling definitions llama-server lists for its built-in tools at GET /tools, word for
word from tools/server/server-tools.cpp (build 0c1e570)."""

from __future__ import annotations


def _fn(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    parameters: dict = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _p(kind: str, description: str) -> dict:
    return {"type": kind, "description": description}


_GLOB_DESCRIPTION = (
    "Recursively search for files matching a glob pattern under a directory. "
    "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
    "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
    "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
    "A pattern containing '/' matches the full relative path; unless already anchored with "
    "\"**/\" or a leading '/', it is automatically prefixed with \"**/\". "
    "Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the output. "
    "Note: directory listings do not apply .gitignore filtering.")
_GREP_DESCRIPTION = (
    "Search for a pattern in files under a path. Returns matching lines with file paths "
    "(and, unless searching a single file, paths relative to the given directory). "
    "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
    "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
    "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
    "containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored).")
_EDIT_DESCRIPTION = (
    "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file "
    "and is matched against the original content, not incrementally. Merge nearby changes into "
    "one edit instead of overlapping edits. Use write_file to replace the whole file.")

DEFINITIONS: dict[str, dict] = {
    "read_file": _fn("read_file", "Read the contents of a file. Optionally specify a 1-based line range. "
                     "If append_loc is true, each line is prefixed with its line number (e.g. \"1\u2192...\").", {
                         "path": _p("string", "Path to the file"),
                         "start_line": _p("integer", "First line to read, 1-based (default: 1)"),
                         "end_line": _p("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                         "append_loc": _p("boolean", "Prefix each line with its line number")}, ["path"]),
    "file_glob_search": _fn("file_glob_search", _GLOB_DESCRIPTION, {
        "path": _p("string", "Base directory to search in"),
        "include": _p("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"),
        "exclude": _p("string", "Glob pattern for files to exclude"),
        "type": _p("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
        "max_depth": _p("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; "
                        "1 = direct children only)"),
        "limit": _p("integer", "Maximum number of results to return, capped at 100 (default 100)")}, ["path"]),
    "grep_search": _fn("grep_search", _GREP_DESCRIPTION, {
        "path": _p("string", "File or directory to search in"),
        "pattern": _p("string", "Pattern to search for (regular expression unless literal is true)"),
        "include": _p("string", "Glob pattern to filter files (default: **)"),
        "exclude": _p("string", "Glob pattern to exclude files"),
        "return_line_numbers": _p("boolean", "If true, include line numbers in results"),
        "literal": _p("boolean", "Treat pattern as a literal string instead of a regular expression (default: false)"),
        "ignore_case": _p("boolean", "Case-insensitive search (default: false)"),
        "context_lines": _p("integer", "Number of lines of context to show before and after each match "
                            "(default: 0)")}, ["path", "pattern"]),
    "exec_shell_command": _fn("exec_shell_command",
                              "Execute a shell command and return its output (stdout and stderr combined).", {
                                  "command": _p("string", "Shell command to execute"),
                                  "timeout": _p("integer", "Timeout in seconds (default 10, max 60)"),
                                  "max_output_size": _p("integer", "Maximum output size in bytes (default 16384)")},
                              ["command"]),
    "write_file": _fn("write_file", "Write content to a file, creating it (including parent directories) if it does "
                      "not exist. May use with edit_file for more complex edits.", {
                          "path": _p("string", "Path of the file to write"),
                          "content": _p("string", "Content to write")}, ["path", "content"]),
    "edit_file": _fn("edit_file", _EDIT_DESCRIPTION, {
        "path": _p("string", "Path to the file to edit"),
        "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                  "items": {"type": "object", "properties": {
                      "old_text": _p("string", "Exact text to find; must be unique in the file and must not overlap "
                                     "with other edits"),
                      "new_text": _p("string", "Text to replace old_text with")},
                      "required": ["old_text", "new_text"]}}}, ["path", "edits"]),
    "get_info": _fn("get_info", "Returns runtime info: the OS name/version and the current working directory", {}),
}
"""Tool name -> its definition."""
