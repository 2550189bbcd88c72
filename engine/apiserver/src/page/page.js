// gitplane's status page: keeps the view live and follows a Pod's logs. The server renders and
// escapes all HTML; this script only swaps in fragments the server rendered and appends log
// text as text, never as markup.
'use strict';
(() => {
  // A burst of events costs a fetch at its first event and one after its last, and at most one
  // fetch starts every GAP ms: the first change shows at once, a thousand cost a few fetches.
  const GAP = 50;
  let timer = null;
  let fetching = false;
  let pending = false;
  let lastStart = -Infinity;
  let updates = 0;
  // The revision of the latest rendered view: where a watch that lost its place restarts.
  let latest = '';

  const view = () => document.getElementById('view');

  function schedule() {
    pending = true;
    if (fetching || timer !== null) return;
    timer = setTimeout(run, Math.max(0, lastStart + GAP - performance.now()));
  }

  async function run() {
    timer = null;
    if (!pending) return;
    pending = false;
    fetching = true;
    lastStart = performance.now();
    try {
      await refresh();
    } finally {
      fetching = false;
      if (pending) schedule();
    }
  }

  async function refresh() {
    const url = new URL(location.href);
    url.searchParams.set('fragment', '1');
    let response;
    try {
      response = await fetch(url, { credentials: 'same-origin' });
    } catch (e) {
      return;
    }
    if (!response.ok) return;
    const template = document.createElement('template');
    template.innerHTML = await response.text();
    const fresh = template.content.getElementById('view');
    const old = view();
    if (!fresh || !old) return;
    // Keep keyboard focus on the same link across the swap.
    const focused = document.activeElement && old.contains(document.activeElement)
      ? document.activeElement.getAttribute('href') : null;
    old.replaceWith(fresh);
    latest = fresh.dataset.rv || latest;
    if (focused) {
      const again = [...fresh.querySelectorAll('a')].find((a) => a.getAttribute('href') === focused);
      if (again) again.focus();
    }
    updates += 1;
    document.body.dataset.updates = String(updates);
    const live = document.getElementById('live');
    if (live) live.textContent = 'Updated ' + new Date().toLocaleTimeString();
  }

  async function lines(response, onLine) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        if (line) onLine(line);
      }
    }
  }

  async function follow(path) {
    let rv = latest;
    for (;;) {
      try {
        const url = new URL(path, location.href);
        if (rv) url.searchParams.set('resourceVersion', rv);
        url.searchParams.set('allowWatchBookmarks', 'true');
        const response = await fetch(url, { credentials: 'same-origin' });
        if (response.status === 401) return;
        if (response.ok) {
          await lines(response, (line) => {
            const event = JSON.parse(line);
            if (event.type === 'ERROR') {
              rv = '';
              schedule();
              return;
            }
            const next = event.object && event.object.metadata && event.object.metadata.resourceVersion;
            if (next) rv = next;
            if (event.type !== 'BOOKMARK') schedule();
          });
        } else {
          rv = '';
        }
      } catch (e) {
        // The connection dropped: resume below.
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
      if (!rv) {
        await refresh();
        rv = latest;
      }
    }
  }

  async function followLog(pre) {
    const limit = 1 << 20;
    try {
      const response = await fetch(pre.dataset.src, { credentials: 'same-origin' });
      if (!response.ok) {
        pre.textContent = 'Logs unavailable: ' + response.status + ' ' + (await response.text());
        return;
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.append(document.createTextNode(value));
        if (pre.textContent.length > limit) pre.textContent = pre.textContent.slice(-limit / 2);
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
      pre.append(document.createTextNode('\n[log stream ended]'));
    } catch (e) {
      pre.append(document.createTextNode('\n[log stream interrupted]'));
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    const v = view();
    if (v) {
      latest = v.dataset.rv || '';
      for (const path of (v.dataset.watch || '').split(' ').filter(Boolean)) follow(path);
    }
    const log = document.getElementById('log');
    if (log && log.dataset.src) followLog(log);
  });
})();
