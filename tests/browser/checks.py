"""Checks the browser tests run on whatever page is shown, one script each (one round
trip): shared so that every walk can add them without a page load of its own."""

from __future__ import annotations

# Every visible form control on the page (the dock's too), and whether something names
# it: a <label> of its own, or aria-label / aria-labelledby (a hidden input needs none).
# A placeholder is not a name.
UNLABELLED = """
const scope = arguments[0] ? document.querySelector(arguments[0]) : document;
return [...scope.querySelectorAll('input, select, textarea')]
  .filter(e => e.type !== 'hidden')
  .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
               && !e.getAttribute('aria-labelledby'))
  .map(e => e.outerHTML.slice(0, 120));"""

FITS = "return document.documentElement.scrollWidth <= window.innerWidth;"

# The main navbar (a user page's, or the staff console's): nothing of it past the right
# edge of the screen, and its sign-out button shown whole where there is one (on a phone
# the menu is folded, its contents not shown, so there is nothing to clip).
NAVBAR_OVERFLOW = """
const nav = document.querySelector('nav.navbar');
if (!nav) return ['no navbar'];
const width = document.documentElement.clientWidth;
const out = [];
if (nav.getBoundingClientRect().right > width + 1) out.push('the navbar is wider than the screen');
for (const e of nav.querySelectorAll('a, button, .navbar-text')) {
  if (!e.getClientRects().length) continue;  // folded away
  const r = e.getBoundingClientRect();
  if (r.right > width + 1 || r.left < -1)
    out.push(`${e.textContent.trim().slice(0, 40)}: ${Math.round(r.left)}..` +
             `${Math.round(r.right)} of ${width}`);
}
const signout = nav.querySelector("form[action$='/auth/signout'] button");
if (signout && signout.getClientRects().length) {
  const r = signout.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  if (!hit || !(hit === signout || signout.contains(hit)))
    out.push('Sign out is covered or clipped');
}
return out;"""

# Every list on a staff page: its table no wider than the box it sits in, and every
# word of every cell on one line and inside its cell (a cell never narrower than its
# longest word). Words are cut at spaces, hyphens and slashes (where a line may break);
# a value cut short on purpose (.op-trunc) is checked for its whole value on hover.
STAFF_LIST_PROBLEMS = """
const out = [];
const box = e => e.getBoundingClientRect();
for (const table of document.querySelectorAll(arguments[0])) {
  if (!table.getClientRects().length) continue;
  const outer = table.closest('.table-responsive') || table.parentElement;
  if (table.scrollWidth > box(outer).width + 1)
    out.push(`table ${table.id || table.className}: ${table.scrollWidth} px ` +
             `in a box of ${Math.round(box(outer).width)}`);
  for (const cell of table.querySelectorAll('td, th')) {
    const cellBox = box(cell);
    for (const cut of cell.querySelectorAll('.op-trunc'))
      if (cut.title !== cut.textContent)
        out.push(`cut short without its whole value: ${cut.textContent}`);
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement.closest('.op-trunc, .sr-only')) continue;
      const re = /[^\\s\\-\\/]+/g;
      let m;
      while ((m = re.exec(node.data))) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        if (!rects.length) continue;  // not shown
        const lines = new Set(rects.map(r => Math.round(r.top)));
        const right = Math.max(...rects.map(r => r.right));
        if (lines.size > 1 || right > cellBox.right + 1)
          out.push(`"${m[0].slice(0, 40)}" broken or past its cell ` +
                   `(${Math.round(cellBox.width)} px)`);
      }
    }
  }
}
return out.slice(0, 20);"""
