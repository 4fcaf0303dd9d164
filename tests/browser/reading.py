"""What a page must read like to a person, checked on a Playwright page as it stands: no Django debug page, no
template text shown, no value shown as None/NaN/undefined/null, no word cut across two lines in a table cell (a
narrow column once read "ai-lab/trainin g"), a top bar that fits the window, and nothing past the window's right
edge. test_pages_read_whole.py reads the main pages of the test cluster with it, test_crawl.py every page of the
demo a person can reach."""

from __future__ import annotations

import re
from typing import Any

SHOWN_AS_NOTHING = re.compile(r"(?<![\w-])(None|NaN|undefined|null)(?![\w-])")
TEMPLATE_TEXT = re.compile(r"\{\{|\{%|\{#")
# A count of one with a plural noun ("1 GPUs").
ONE_PLURAL = re.compile(r"(?<![\d.,])1 (GPUs|nodes|jobs|cards)\b")
# Django's technical 404 and 500 pages (DEBUG on), by their markup (a job's log may well show a traceback).
DEBUG_PAGE = re.compile(r"DEBUG = True</code>|<div id=\"traceback\">|Using the URLconf defined in")

# Each word of each table cell's text (a hyphen or a slash ends one), measured: one laid out on two lines was cut.
CUT_WORDS = """() => {
  const cut = [];
  for (const cell of document.querySelectorAll("table td, table th")) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const re = /[^\\s\\/-]+[\\/-]?/g;  // a break after a hyphen or a slash is a wrap, not a cut
      let m;
      while ((m = re.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1) cut.push(m[0]);
      }
    }
  }
  return cut;
}"""

# The top bar's links all within the window, over the bar's own background.
HEADER_FITS = """() => {
  const top = document.querySelector("header.top");
  if (!top) return true;
  const bar = top.getBoundingClientRect();
  return [...top.querySelectorAll("a, button")].every(a => {
    const r = a.getBoundingClientRect();
    return r.right <= window.innerWidth && r.bottom <= bar.bottom + 1;
  });
}"""


# What runs past the window's right edge (the page scrolls sideways): the innermost elements that do, a few.
PAST_THE_WINDOW = """() => {
  if (document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1) return [];
  const past = [...document.querySelectorAll("body *")].filter(e => {
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.right > document.documentElement.clientWidth + 1;
  });
  return past.filter(e => !past.some(o => o !== e && e.contains(o)))
    .slice(0, 3).map(e => `${e.tagName.toLowerCase()}: ${(e.innerText || "").trim().slice(0, 60)}`);
}"""


def _around(text: str, match: re.Match, width: int = 40) -> str:
    return " ".join(text[max(0, match.start() - width) : match.end() + width].split())


def unreadable(page: Any, *, where: str = "main") -> list[str]:
    """What reads wrong on `page` as it stands (each in words, with the text around it), in its element `where`
    for the text checks; [] when it reads whole."""
    problems = []
    text = page.inner_text(where)
    if found := SHOWN_AS_NOTHING.search(text):
        problems.append(f"a value shown as {found.group(0)!r}: ...{_around(text, found)}...")
    if found := TEMPLATE_TEXT.search(text):
        problems.append(f"template text shown: ...{_around(text, found)}...")
    if found := ONE_PLURAL.search(text):
        problems.append(f"one with a plural: ...{_around(text, found)}...")
    if DEBUG_PAGE.search(page.content()):
        problems.append("a Django debug page")
    if cut := page.evaluate(CUT_WORDS):
        problems.append(f"words cut across lines in table cells: {cut[:10]}")
    if not page.evaluate(HEADER_FITS):
        problems.append("the top bar runs past the window")
    if past := page.evaluate(PAST_THE_WINDOW):
        problems.append(f"the page runs past the window's right edge: {past}")
    return problems
