/*
 * tree.c - recursive-descent reader from tokens to the directive tree.
 *
 * One token of lookahead is enough: a directive's words run until a newline,
 * ';', '{' or '}' (so `listen a { bind x }` needs no ';'), and a '{' opens
 * its block.  Recursion is bounded by CONF_MAX_DEPTH; a block nested deeper
 * is reported and skipped without recursing.
 */
#include "rules/tree.h"

#include "rules/conf_mem.h"
#include "rules/diag.h"
#include "rules/lexer.h"

#include <stdlib.h>

/* The first allocation for a directive's words; it doubles from there. */
#define CONF_WORDS_INITIAL 4

struct conf_reader {
    struct conf_lexer lx;
    struct conf_token tok; /* the lookahead; owns tok.text until taken */
    struct conf_diags *diags;
};

void conf_tree_free(struct conf_node *list)
{
    while (list != NULL) {
        struct conf_node *next = list->next;
        for (size_t i = 0; i < list->n_words; i++) {
            free(list->words[i].text);
        }
        free(list->words);
        conf_tree_free(list->children);
        free(list);
        list = next;
    }
}

static int conf_reader_advance(struct conf_reader *rd)
{
    free(rd->tok.text);
    rd->tok.text = NULL;
    return conf_lexer_next(&rd->lx, &rd->tok);
}

/* Move the lookahead WORD or STRING into the directive's word list. */
static int conf_node_take_word(struct conf_reader *rd, struct conf_node *node)
{
    if (node->n_words == node->cap_words) {
        size_t cap = node->cap_words == 0 ? CONF_WORDS_INITIAL : node->cap_words * 2;
        struct conf_word *words = conf_mem_realloc(node->words, cap * sizeof(*words));
        if (words == NULL) {
            conf_diag_oom(rd->diags);
            return -1;
        }
        node->words = words;
        node->cap_words = cap;
    }
    node->words[node->n_words] = (struct conf_word){
        .text = rd->tok.text,
        .loc = rd->tok.loc,
        .quoted = rd->tok.kind == CONF_TOK_STRING,
        .glued = rd->tok.glued && node->n_words > 0,
    };
    node->n_words++;
    rd->tok.text = NULL;
    return 0;
}

/* Skip a block nested too deeply, up to its matching '}' or end of file. */
static int conf_reader_skip_block(struct conf_reader *rd)
{
    unsigned depth = 1;

    while (depth > 0 && rd->tok.kind != CONF_TOK_EOF) {
        if (rd->tok.kind == CONF_TOK_LBRACE) {
            depth++;
        } else if (rd->tok.kind == CONF_TOK_RBRACE) {
            depth--;
        }
        if (conf_reader_advance(rd) < 0) {
            return -1;
        }
    }
    return 0;
}

static int conf_reader_block(struct conf_reader *rd, unsigned depth, struct conf_node **list,
                             const struct conf_loc *open);

/* The lookahead is the '{' of `node`: read its block. */
static int conf_reader_node_block(struct conf_reader *rd, unsigned depth, struct conf_node *node)
{
    node->has_block = true;
    node->block_loc = rd->tok.loc;
    if (conf_reader_advance(rd) < 0) {
        return -1;
    }
    if (depth + 1 > CONF_MAX_DEPTH) {
        conf_diag_add(rd->diags, CONF_ERROR, node->block_loc, NULL,
                      "blocks are nested too deeply (at most %d levels)", CONF_MAX_DEPTH);
        return conf_reader_skip_block(rd);
    }
    return conf_reader_block(rd, depth + 1, &node->children, &node->block_loc);
}

/* Read one directive starting at the lookahead (a WORD, STRING or a '{'
 * with no name) and link it at *link; a nameless block is read and dropped. */
static int conf_reader_directive(struct conf_reader *rd, unsigned depth, struct conf_node **link)
{
    struct conf_node *node = conf_mem_calloc(1, sizeof(*node));

    if (node == NULL) {
        conf_diag_oom(rd->diags);
        return -1;
    }
    *link = node;
    while (rd->tok.kind == CONF_TOK_WORD || rd->tok.kind == CONF_TOK_STRING) {
        if (conf_node_take_word(rd, node) < 0 || conf_reader_advance(rd) < 0) {
            return -1;
        }
    }
    if (rd->tok.kind != CONF_TOK_LBRACE) {
        return 0;
    }
    if (node->n_words == 0) {
        conf_diag_add(rd->diags, CONF_ERROR, rd->tok.loc, NULL,
                      "'{' has no directive name before it");
        *link = NULL;
        int rc = conf_reader_node_block(rd, depth, node);
        conf_tree_free(node);
        return rc;
    }
    return conf_reader_node_block(rd, depth, node);
}

/* Handle a '}' seen at `depth`; returns 1 when it closes the current block. */
static int conf_reader_rbrace(struct conf_reader *rd, unsigned depth)
{
    if (depth == 0) {
        conf_diag_add(rd->diags, CONF_ERROR, rd->tok.loc, "no block is open here",
                      "unexpected '}'");
    }
    if (conf_reader_advance(rd) < 0) {
        return -1;
    }
    return depth > 0 ? 1 : 0;
}

/* Read directives into *list until the '}' closing this block (consumed) or
 * end of file.  `open` is the '{' of this block, NULL at top level. */
static int conf_reader_block(struct conf_reader *rd, unsigned depth, struct conf_node **list,
                             const struct conf_loc *open)
{
    struct conf_node **tail = list;

    for (;;) {
        int rc = 0;
        switch (rd->tok.kind) {
        case CONF_TOK_EOF:
            if (open != NULL) {
                conf_diag_add(rd->diags, CONF_ERROR, *open, NULL,
                              "'{' opened here is never closed");
            }
            return 0;
        case CONF_TOK_NEWLINE:
        case CONF_TOK_SEMI:
            rc = conf_reader_advance(rd);
            break;
        case CONF_TOK_RBRACE:
            rc = conf_reader_rbrace(rd, depth);
            if (rc == 1) {
                return 0;
            }
            break;
        default:
            rc = conf_reader_directive(rd, depth, tail);
            while (*tail != NULL) {
                tail = &(*tail)->next;
            }
            break;
        }
        if (rc < 0) {
            return -1;
        }
    }
}

int conf_tree_parse(const char *text, size_t len, struct conf_diags *diags, struct conf_node **out)
{
    struct conf_reader rd = {.diags = diags};
    struct conf_node *list = NULL;
    int rc;

    conf_lexer_init(&rd.lx, text, len, diags);
    rc = conf_lexer_next(&rd.lx, &rd.tok);
    if (rc == 0) {
        rc = conf_reader_block(&rd, 0, &list, NULL);
    }
    free(rd.tok.text);
    if (rc < 0) {
        conf_tree_free(list);
        list = NULL;
    }
    *out = list;
    return rc;
}
