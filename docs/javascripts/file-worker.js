/* Web workers for a site opened from the file system (site/index.html, no server).
 *
 * Chromium and Firefox refuse `new Worker(url)` to a page whose address is file://, and the
 * theme runs its search in a worker, so search stayed empty there. On such a page this script
 * (loaded in <head>, before the theme's) puts a stand-in in place of Worker: it runs the worker's
 * script in a hidden frame of the page, and messages go both ways as a worker's do: later, never
 * at once, and as copies (structured clones) made in the receiving side's realm. Served over HTTP,
 * the page keeps the browser's own Worker. tests/test_docs_site.py searches a file:// site with it.
 */
(function () {
  'use strict';
  if (location.protocol !== 'file:' || typeof window.Worker !== 'function') {
    return;
  }

  class FrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.pending = [];          // messages posted before the worker's script has run
      this.frame = document.createElement('iframe');
      this.frame.hidden = true;
      this.frame.tabIndex = -1;
      this.frame.setAttribute('aria-hidden', 'true');
      (document.body || document.documentElement).appendChild(this.frame);
      this.scope = this.frame.contentWindow;
      // What the worker's script posts comes here, copied into this page's realm.
      this.scope.postMessage = (data) => setTimeout(() => this.receive(structuredClone(data)));
      this.scope.close = () => this.terminate();
      const script = this.scope.document.createElement('script');
      script.src = new URL(url, document.baseURI).href;
      script.onload = () => {
        const waiting = this.pending;
        this.pending = null;
        waiting.forEach((data) => this.postMessage(data));
      };
      script.onerror = () => this.fail(`the worker's script ${script.src} did not load`);
      this.scope.document.head.appendChild(script);
    }

    postMessage(data) {
      if (this.pending) {
        this.pending.push(data);
        return;
      }
      const scope = this.scope;
      if (!scope) {
        return;                   // terminated: a worker's messages are dropped then too
      }
      const copy = scope.structuredClone(data);
      setTimeout(() => scope.dispatchEvent(new scope.MessageEvent('message', { data: copy })));
    }

    receive(data) {
      const event = new MessageEvent('message', { data });
      if (typeof this.onmessage === 'function') {
        this.onmessage(event);
      }
      this.dispatchEvent(event);
    }

    fail(message) {
      const event = new ErrorEvent('error', { message });
      if (typeof this.onerror === 'function') {
        this.onerror(event);
      }
      this.dispatchEvent(event);
    }

    terminate() {
      if (this.frame) {
        this.frame.remove();
      }
      this.frame = this.scope = null;
      this.pending = null;
    }
  }

  window.Worker = FrameWorker;
}());
