/*
 * html.c - HTML escaping and the page's frame.  See html.h.
 */
#include "offline/html.h"

#include <stdbool.h>

#include "offline/journal_reader.h"

/* html_text(), with line breaks kept when `lines`. */
static void escape(FILE *out, const char *s, bool lines)
{
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    while (*p != '\0') {
        size_t n = journal_utf8_char_len(p);
        if (lines && *p == '\n') {
            fputc('\n', out);
            p++;
            continue;
        }
        if (n == 0 || *p < 0x20 || *p == 0x7f) {
            fputs("\xef\xbf\xbd", out);
            p++;
            continue;
        }
        switch (*p) {
        case '&':
            fputs("&amp;", out);
            break;
        case '<':
            fputs("&lt;", out);
            break;
        case '>':
            fputs("&gt;", out);
            break;
        case '"':
            fputs("&quot;", out);
            break;
        case '\'':
            fputs("&#39;", out);
            break;
        default:
            fwrite(p, 1, n, out);
        }
        p += n;
    }
}

void html_text(FILE *out, const char *s)
{
    escape(out, s, false);
}

void html_text_block(FILE *out, const char *s)
{
    escape(out, s, true);
}

/* Colours: the series of the charts (first deliveries blue, copies orange, faults red, acks
 * green) and the verdicts (NOT IDEMPOTENT red, IDEMPOTENT green, IDEMPOTENT* amber, UNTESTED
 * grey with a dashed edge: as loud as the others, never mistaken for a pass). */
static const char html_css[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1f2328;"
    "background:#f6f8fa;margin:0}\n"
    "main{max-width:1240px;margin:0 auto;padding:24px}\n"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;"
    "border-bottom:1px solid "
    "#d0d7de;padding-bottom:4px}section>h2:first-child{margin-top:4px}h3{font-size:14px;margin:"
    "16px 0 4px}\n"
    "section,.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;"
    "margin:12px 0}\n"
    ".meta{color:#57606a}.meta b{color:#1f2328;font-weight:600}\n"
    "table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}\n"
    "th,td{border-bottom:1px solid #eaeef2;padding:4px 10px;text-align:left;vertical-align:top}\n"
    "th{background:#f6f8fa;font-weight:600}td.n,th.n{text-align:right}\n"
    "code,.id{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}\n"
    ".id{word-break:break-all}.scroll{overflow-x:auto}\n"
    "table.verdict{font-size:12.5px}table.verdict td,table.verdict th{padding:4px "
    "7px}table.verdict td:first-child{min-width:150px;max-width:260px;"
    "overflow-wrap:anywhere}table.verdict td{white-space:nowrap}"
    "table.verdict td:first-child,table.verdict td.v{white-space:normal}table.verdict "
    ".id{word-break:normal}\n"
    ".badge{display:inline-block;padding:2px 8px;border-radius:4px;font-weight:700;"
    "font-size:12px;letter-spacing:.02em;white-space:nowrap}\n"
    ".v-not{background:#cf222e;color:#fff}.v-ok{background:#1a7f37;color:#fff}\n"
    ".v-partial{background:#bf8700;color:#fff}\n"
    ".v-untested{background:#eaeef2;color:#24292f;border:2px dashed #57606a}\n"
    ".big{font-size:20px;padding:6px 14px}\n"
    ".alert{border-left:6px solid #cf222e;background:#fff5f5}\n"
    ".warn{border-left:6px solid #bf8700;background:#fffbeb}\n"
    ".alert p,.warn p{margin:4px 0}\n"
    ".missing{color:#9a6700;font-weight:600}.stalled{color:#cf222e;font-weight:700}\n"
    "svg{display:block;max-width:100%;height:auto;font:11px system-ui,sans-serif}\n"
    "svg text{fill:#57606a}svg text.lab{fill:#1f2328}\n"
    "svg .axis{stroke:#8c959f;stroke-width:1}svg .grid{stroke:#eaeef2;stroke-width:1}\n"
    ".s0{fill:#4c78a8}.s1{fill:#f58518}.s2{fill:#9d755d}.s3{fill:#bab0ac}.s4{fill:#d9d9d9}\n"
    ".fault-bin{fill:#e45756}.delay-bin{fill:#f58518}\n"
    ".d-first{fill:#4c78a8}.d-copy{fill:#f58518}.d-overlap{fill:#d62728}"
    ".d-set-aside{fill:#9d755d}.d-withheld{fill:#bab0ac}.d-unreached{fill:#d9d9d9}\n"
    ".m-fault{fill:#e45756}.m-ack{fill:#1a7f37}.m-nack{fill:#8250df}.m-closed{fill:#24292f}"
    ".m-open{fill:#fff;stroke:#24292f}\n"
    ".legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;"
    "width:10px;height:10px;margin-right:4px;border-radius:2px;vertical-align:-1px}\n"
    ".k0{background:#4c78a8}.k1{background:#f58518}.k2{background:#9d755d}.k3{background:#bab0ac}"
    ".k4{background:#d9d9d9}.kf{background:#e45756}.ka{background:#1a7f37}.kn{background:#8250df}"
    ".kc{background:#24292f}.ko{background:#d62728}\n"
    "details pre{white-space:pre-wrap;font-size:12px;background:#f6f8fa;padding:8px;"
    "border-radius:4px;overflow-x:auto}\n"
    "footer{color:#57606a;font-size:12px;margin-top:24px}\n";

void html_begin(FILE *out, const char *title)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
          "style-src 'unsafe-inline'\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>",
          out);
    html_text(out, title);
    fprintf(out, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<main>\n", html_css);
}

void html_end(FILE *out)
{
    fputs("</main>\n</body>\n</html>\n", out);
}
