/* A byte-level BPE encoder for the Qwen2 / Llama-3 (cl100k) split regex, exact to tiktoken.
 *
 * Why: tiktoken spends about half of a prompt's encode in its split regex (fancy_regex's backtracking VM
 * over regex-automata, once per pre-token). The regex is fixed and small, so it is written out here as
 * code: one pass over the UTF-8 text, classifying each character with a table. The merges are tiktoken's
 * own algorithm, so the ids are tiktoken's (and, where tiktoken was verified against Hugging Face at
 * load, Hugging Face's).
 *
 * The regex, alternatives tried in order at each position (leftmost-first):
 *   1 (?i:'s|'t|'re|'ve|'m|'ll|'d)   2 [^\r\n\p{L}\p{N}]?\p{L}+   3 \p{N} (Qwen2) or \p{N}{1,3} (Llama-3)
 *   4 ' ?[^\s\p{L}\p{N}]+[\r\n]*'    5 \s*[\r\n]+   6 \s+(?!\S)   7 \s+
 * Every character is exactly one of: a letter (L), a number (N), white space (WS), or none of these
 * ("other", what alternative 4 runs over). The class table is made by the caller from tiktoken's own regex
 * engine (node/pipeline/bpe_native.py), so both agree on every code point whatever their Unicode versions.
 *
 * Added tokens (a tokenizer's special tokens) are matched first, leftmost-longest in one scan, through a byte
 * trie; the regex splits the text between them. Characters whose class has C_SLOW (for an NFC tokenizer: any
 * after which the text may not be in NFC) make `encode` return None, so the caller takes its slow path.
 *
 * Invariants: the text is valid UTF-8 (a str without lone surrogates); every single byte has a rank (checked
 * at init); ranks are < 2**32 - 1. The encoder is immutable after __init__ but for its cache of merged
 * pieces, which one call at a time holds (an atomic flag), so threads share it; it releases the GIL for long
 * texts (the str is immutable and referenced for the whole call). Memory: the vocabulary's hash table (16
 * bytes a slot, at most half full) and bytes and the trie, fixed at init; the 512 kB cache, on first use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define C_L 1
#define C_N 2
#define C_WS 4
#define C_SLOW 8 /* the text must take the caller's slow path (e.g. it may not be in NFC): encode returns None */
#define CLASS_COUNT 0x110000
#define RANK_NONE 0xFFFFFFFFu
#define GONE 0xFFFFFFFFu
/* Shorter texts encode in a few microseconds: dropping the GIL would only invite a thread switch. */
#define RELEASE_GIL_BYTES 4096
/* Pieces up to this many bytes merge by tiktoken's linear scan; longer ones through a heap (O(n log n)). */
#define SCAN_MERGE_MAX 24
/* The heap's arrays live on the stack up to this many bytes (~8 kB). */
#define HEAP_LOCAL_MAX 256
/* Merged pieces are remembered (direct-mapped, by hash): words recur, and merging is most of the encode. */
#define CACHE_ENTRIES 8192
#define CACHE_KEY_MAX 24
#define CACHE_IDS_MAX 8

typedef struct {
    uint32_t hash; /* 0: empty slot */
    uint32_t off;  /* into arena */
    uint32_t len;
    uint32_t rank;
} Slot;

/* Added tokens as a byte trie: children are a linked list of siblings (few per node). */
typedef struct {
    int32_t child, sibling, id; /* id -1: no token ends here */
    uint8_t byte;
} TrieNode;

typedef struct {
    uint32_t hash; /* 0: empty */
    uint8_t len, count;
    uint8_t key[CACHE_KEY_MAX];
    uint32_t ids[CACHE_IDS_MAX];
} CacheEntry;

typedef struct {
    PyObject_HEAD
    CacheEntry *cache; /* allocated on first use; used by one call at a time (cache_busy) */
    int cache_busy;
    Slot *slots;
    uint32_t mask;
    uint8_t *arena;
    PyObject *classes; /* bytes, one class per code point */
    const uint8_t *cls;
    int digit_run; /* 1: \p{N}; 3: \p{N}{1,3} */
    int has_slow;  /* some character has C_SLOW */
    TrieNode *trie; /* node 0 is the root; NULL: no added tokens */
    size_t trie_len;
    uint8_t first[256]; /* bytes an added token starts with */
    int first_count;
    uint8_t only_first; /* the one such byte, when first_count == 1 */
} EncoderObject;

static inline uint32_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, folded */
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 29;
    return (uint32_t)h | 1u;
}

static inline int same_bytes(const uint8_t *a, const uint8_t *b, size_t n) {
    if (n > 16) return memcmp(a, b, n) == 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) return 0;
    }
    return 1;
}

static inline uint32_t lookup_hashed(const EncoderObject *e, const uint8_t *p, size_t n, uint32_t h) {
    for (uint32_t i = h & e->mask;; i = (i + 1) & e->mask) {
        const Slot *s = &e->slots[i];
        if (s->hash == 0) return RANK_NONE;
        if (s->hash == h && s->len == n && same_bytes(e->arena + s->off, p, n)) return s->rank;
    }
}

static inline uint32_t lookup(const EncoderObject *e, const uint8_t *p, size_t n) {
    return lookup_hashed(e, p, n, hash_bytes(p, n));
}

/* The code point at s[i] (valid UTF-8); *w gets its length in bytes. */
static inline uint32_t decode(const uint8_t *s, size_t i, int *w) {
    uint8_t b = s[i];
    if (b < 0x80) { *w = 1; return b; }
    if (b < 0xE0) { *w = 2; return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F); }
    if (b < 0xF0) {
        *w = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *w = 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6)
           | (s[i + 3] & 0x3F);
}

/* Output: token ids (encode) or the end offset of each piece (split). */
typedef struct {
    uint32_t *items;
    size_t len, cap;
    int split;         /* record piece ends instead of encoding */
    CacheEntry *cache; /* this call's to use, or NULL */
} Out;

static inline int push(Out *o, uint32_t v) {
    if (o->len == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 512;
        uint32_t *grown = realloc(o->items, cap * sizeof(uint32_t));
        if (!grown) return -1;
        o->items = grown;
        o->cap = cap;
    }
    o->items[o->len++] = v;
    return 0;
}

typedef struct {
    size_t start;
    uint32_t rank; /* of merging this part with the next one */
} Part;

/* tiktoken's byte_pair_merge: repeatedly merge the adjacent pair whose merged bytes rank lowest
   (the leftmost on ties) until no merged pair is a token. */
static int merge_scan(const EncoderObject *e, const uint8_t *p, size_t n, Out *o) {
    Part parts[SCAN_MERGE_MAX + 1];
    size_t np = 0, min_i = 0;
    uint32_t min_rank = RANK_NONE;
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = lookup(e, p + i, 2);
        if (r < min_rank) { min_rank = r; min_i = i; }
        parts[np++] = (Part){i, r};
    }
    parts[np++] = (Part){n - 1, RANK_NONE};
    parts[np++] = (Part){n, RANK_NONE};
    while (min_rank != RANK_NONE) {
        size_t i = min_i;
        if (i > 0) {
            parts[i - 1].rank = i + 2 < np ? lookup(e, p + parts[i - 1].start, parts[i + 2].start - parts[i - 1].start)
                                           : RANK_NONE;
        }
        parts[i].rank = i + 3 < np ? lookup(e, p + parts[i].start, parts[i + 3].start - parts[i].start) : RANK_NONE;
        memmove(&parts[i + 1], &parts[i + 2], (np - i - 2) * sizeof(Part));
        np--;
        min_rank = RANK_NONE;
        for (size_t k = 0; k + 1 < np; k++) {
            if (parts[k].rank < min_rank) { min_rank = parts[k].rank; min_i = k; }
        }
    }
    for (size_t k = 0; k + 1 < np; k++) {
        if (push(o, lookup(e, p + parts[k].start, parts[k + 1].start - parts[k].start))) return -1;
    }
    return 0;
}

typedef struct {
    uint32_t rank, start, end; /* merging the parts that span [start, end) */
} Cand;

static inline int cand_less(const Cand *a, const Cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->start < b->start);
}

static void heap_push(Cand *h, size_t *len, Cand c) {
    size_t i = (*len)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static Cand heap_pop(Cand *h, size_t *len) {
    Cand top = h[0], last = h[--(*len)];
    size_t i = 0, n = *len;
    for (;;) {
        size_t child = 2 * i + 1, best = i;
        const Cand *smallest = &last;
        if (child < n && cand_less(&h[child], smallest)) { best = child; smallest = &h[child]; }
        if (child + 1 < n && cand_less(&h[child + 1], smallest)) best = child + 1;
        if (best == i) break;
        h[i] = h[best];
        i = best;
    }
    if (n) h[i] = last;
    return top;
}

/* The same merges in O(n log n) for long pieces (a 1 MB run of letters would take minutes by scanning):
   parts form a linked list over byte offsets; candidate merges wait in a heap ordered by (rank, start),
   which is "lowest rank, leftmost on ties"; an entry is stale, and skipped, once its parts changed. */
static int merge_heap(const EncoderObject *e, const uint8_t *p, size_t n, Out *o) {
    uint32_t next_local[HEAP_LOCAL_MAX + 1], prev_local[HEAP_LOCAL_MAX + 1];
    Cand heap_local[3 * HEAP_LOCAL_MAX];
    int local = n <= HEAP_LOCAL_MAX; /* most pieces: no allocation */
    /* next[i]: end of the part starting at i, or GONE; prev[i]: start of the part before it */
    uint32_t *next = local ? next_local : malloc((n + 1) * sizeof(uint32_t));
    uint32_t *prev = local ? prev_local : malloc((n + 1) * sizeof(uint32_t));
    Cand *heap = local ? heap_local : malloc(3 * n * sizeof(Cand)); /* n - 1 pairs, then at most 2 per merge */
    size_t hl = 0;
    int rc = 0;
    if (!next || !prev || !heap) { rc = -1; goto done; }
    for (size_t i = 0; i <= n; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)(i ? i - 1 : 0);
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = lookup(e, p + i, 2);
        if (r != RANK_NONE) heap_push(heap, &hl, (Cand){r, (uint32_t)i, (uint32_t)(i + 2)});
    }
    while (hl) {
        Cand c = heap_pop(heap, &hl);
        uint32_t mid = next[c.start];
        if (mid == GONE || mid >= n || next[mid] != c.end) continue;
        next[c.start] = c.end;
        next[mid] = GONE;
        if (c.end < n) {
            prev[c.end] = c.start;
            uint32_t r = lookup(e, p + c.start, next[c.end] - c.start);
            if (r != RANK_NONE) heap_push(heap, &hl, (Cand){r, c.start, next[c.end]});
        }
        if (c.start > 0) {
            uint32_t left = prev[c.start];
            uint32_t r = lookup(e, p + left, c.end - left);
            if (r != RANK_NONE) heap_push(heap, &hl, (Cand){r, left, c.end});
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) {
        if (push(o, lookup(e, p + i, next[i] - i))) { rc = -1; break; }
    }
done:
    if (!local) {
        free(next);
        free(prev);
        free(heap);
    }
    return rc;
}

/* One piece: a token itself (most words), else merged byte by byte. */
static inline int emit(const EncoderObject *e, const uint8_t *p, size_t n, size_t end, Out *o) {
    if (o->split) return push(o, (uint32_t)end);
    uint32_t h = hash_bytes(p, n);
    uint32_t r = lookup_hashed(e, p, n, h);
    if (r != RANK_NONE) return push(o, r);
    if (n > SCAN_MERGE_MAX) return merge_heap(e, p, n, o);
    CacheEntry *slot = o->cache && n <= CACHE_KEY_MAX ? &o->cache[h & (CACHE_ENTRIES - 1)] : NULL;
    if (slot && slot->hash == h && slot->len == n && same_bytes(slot->key, p, n)) {
        for (int k = 0; k < slot->count; k++) {
            if (push(o, slot->ids[k])) return -1;
        }
        return 0;
    }
    size_t before = o->len;
    if (merge_scan(e, p, n, o)) return -1;
    if (slot && o->len - before <= CACHE_IDS_MAX) {
        slot->hash = h;
        slot->len = (uint8_t)n;
        slot->count = (uint8_t)(o->len - before);
        memcpy(slot->key, p, n);
        memcpy(slot->ids, o->items + before, (o->len - before) * sizeof(uint32_t));
    }
    return 0;
}

#define IS_OTHER(k) (((k) & (C_L | C_N | C_WS)) == 0)

/* The end of the run of characters of class ``want`` (a mask) starting at q. */
static inline size_t run_end(const uint8_t *s, size_t n, size_t q, const uint8_t *cls, uint8_t want) {
    while (q < n) {
        if (s[q] < 0x80) {
            if (!(cls[s[q]] & want)) break;
            q++;
            continue;
        }
        int w;
        uint32_t c = decode(s, q, &w);
        if (!(cls[c] & want)) break;
        q += w;
    }
    return q;
}

static inline size_t other_run_end(const uint8_t *s, size_t n, size_t q, const uint8_t *cls) {
    while (q < n) {
        int w;
        uint32_t c = decode(s, q, &w);
        if (!IS_OTHER(cls[c])) break;
        q += w;
    }
    return q;
}

/* The end of alternative 1 at i (s[i] == '\''), or 0 if it does not match. Under (?i), 's' also matches
   U+017F (LATIN SMALL LETTER LONG S, which case-folds to 's'); no other character folds to these letters. */
static inline size_t contraction_end(const uint8_t *s, size_t n, size_t i) {
    if (i + 1 >= n) return 0;
    uint8_t a = s[i + 1] | 0x20;
    if (s[i + 1] < 0x80) {
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n && (((a == 'r' || a == 'v') && (s[i + 2] | 0x20) == 'e') || (a == 'l' && (s[i + 2] | 0x20) == 'l')))
            return i + 3;
        return 0;
    }
    if (s[i + 1] == 0xC5 && i + 2 < n && s[i + 2] == 0xBF) return i + 3; /* U+017F */
    return 0;
}

static int run_regex(const EncoderObject *e, const uint8_t *s, size_t n, Out *o) {
    const uint8_t *cls = e->cls;
    size_t i = 0;
    while (i < n) {
        int w0, w1 = 0;
        uint32_t c0 = decode(s, i, &w0);
        uint8_t k0 = cls[c0];
        size_t j = i + w0, end;
        uint8_t k1 = 0;
        if (j < n) k1 = cls[decode(s, j, &w1)];
        if (c0 == '\'' && (end = contraction_end(s, n, i))) {
        } else if (k0 & C_L) { /* 2, without the optional character */
            end = run_end(s, n, j, cls, C_L);
        } else if (!(k0 & C_N) && c0 != '\r' && c0 != '\n' && (k1 & C_L)) { /* 2, with it */
            end = run_end(s, n, j + w1, cls, C_L);
        } else if (k0 & C_N) { /* 3 */
            end = j;
            for (int d = 1; d < e->digit_run && end < n; d++) {
                int w;
                if (!(cls[decode(s, end, &w)] & C_N)) break;
                end += w;
            }
        } else if (IS_OTHER(k0) || (c0 == ' ' && j < n && IS_OTHER(k1))) { /* 4 */
            end = other_run_end(s, n, IS_OTHER(k0) ? j : j + w1, cls);
            while (end < n && (s[end] == '\r' || s[end] == '\n')) end++;
        } else { /* c0 is white space: 5, 6 or 7 over its run */
            size_t q = i, last_newline = n;
            while (q < n) {
                int w;
                uint32_t c = decode(s, q, &w);
                if (!(cls[c] & C_WS)) break;
                if (c == '\r' || c == '\n') last_newline = q;
                q += w;
            }
            if (last_newline != n) {
                end = last_newline + 1; /* 5: the \s* gives back what follows the run's last newline */
            } else if (q == n) {
                end = q; /* 6 at the end of the text */
            } else {
                size_t last = q - 1; /* 6 leaves the run's last character to the next piece; 7 if it is alone */
                while ((s[last] & 0xC0) == 0x80) last--;
                end = last > i ? last : q;
            }
        }
        if (emit(e, s + i, end - i, end, o)) return -1;
        i = end;
    }
    return 0;
}

/* The longest added token starting at s[i], as its id (and *end), or -1. */
static int32_t added_at(const EncoderObject *e, const uint8_t *s, size_t n, size_t i, size_t *end) {
    int32_t node = 0, found = -1;
    for (size_t k = i; k < n; k++) {
        int32_t child = e->trie[node].child;
        while (child >= 0 && e->trie[child].byte != s[k]) child = e->trie[child].sibling;
        if (child < 0) break;
        node = child;
        if (e->trie[node].id >= 0) {
            found = e->trie[node].id;
            *end = k + 1;
        }
    }
    return found;
}

/* The next position at or after i where a byte starts an added token (n if none). */
static inline size_t next_candidate(const EncoderObject *e, const uint8_t *s, size_t n, size_t i) {
    if (e->first_count == 1) {
        const uint8_t *hit = memchr(s + i, e->only_first, n - i);
        return hit ? (size_t)(hit - s) : n;
    }
    while (i < n && !e->first[s[i]]) i++;
    return i;
}

/* Added tokens matched leftmost-longest in one scan, the text between them split by the regex. */
static int encode_with_added(const EncoderObject *e, const uint8_t *s, size_t n, Out *o) {
    size_t segment = 0, i = 0;
    while ((i = next_candidate(e, s, n, i)) < n) {
        size_t end;
        int32_t id = added_at(e, s, n, i, &end);
        if (id < 0) {
            i++;
            continue;
        }
        if (i > segment && run_regex(e, s + segment, i - segment, o)) return -1;
        if (push(o, (uint32_t)id)) return -1;
        segment = i = end;
    }
    return segment < n ? run_regex(e, s + segment, n - segment, o) : 0;
}

/* Whether the UTF-8 text holds a character whose class has C_SLOW. */
static int has_slow_character(const EncoderObject *e, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int w;
        uint32_t c = decode(s, i, &w);
        if (e->cls[c] & C_SLOW) return 1;
        i += w;
    }
    return 0;
}

/* mode 0: encode, matching added tokens and refusing C_SLOW characters; 1: encode plain text; 2: split. */
static PyObject *run(EncoderObject *self, PyObject *text, int mode) {
    if (!self->classes) { /* set last by a successful __init__ */
        PyErr_SetString(PyExc_RuntimeError, "Encoder was not initialized");
        return NULL;
    }
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "text must be a str");
        return NULL;
    }
    PyObject *utf8 = NULL;
    const uint8_t *s;
    Py_ssize_t n;
    int ascii = PyUnicode_IS_ASCII(text);
    if (ascii) { /* its own storage is UTF-8 */
        s = PyUnicode_DATA(text);
        n = PyUnicode_GET_LENGTH(text);
    } else {
        utf8 = PyUnicode_AsUTF8String(text); /* fails on a lone surrogate */
        if (!utf8) return NULL;
        s = (const uint8_t *)PyBytes_AS_STRING(utf8);
        n = PyBytes_GET_SIZE(utf8);
    }
    Out o = {NULL, 0, 0, mode == 2, NULL};
    /* The cache serves one call at a time: a call that finds it taken (another thread, GIL released) merges
       without it. Taken and given back while holding the GIL or not, hence the atomics. */
    int took_cache = mode != 2 && !__atomic_exchange_n(&self->cache_busy, 1, __ATOMIC_ACQUIRE);
    if (took_cache) {
        if (!self->cache) self->cache = calloc(CACHE_ENTRIES, sizeof(CacheEntry));
        o.cache = self->cache;
    }
    int rc = 0, slow = 0;
    int added = mode == 0 && self->trie != NULL;
    int check = mode == 0 && self->has_slow && !ascii;
    PyThreadState *released = n >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    if (check) slow = has_slow_character(self, s, (size_t)n);
    if (!slow) rc = added ? encode_with_added(self, s, (size_t)n, &o) : run_regex(self, s, (size_t)n, &o);
    if (released) PyEval_RestoreThread(released);
    if (took_cache) __atomic_store_n(&self->cache_busy, 0, __ATOMIC_RELEASE);
    PyObject *result = NULL;
    if (rc) {
        PyErr_NoMemory();
    } else if (slow) {
        result = Py_None;
        Py_INCREF(result);
    } else if (mode != 2) {
        result = PyBytes_FromStringAndSize((const char *)o.items, (Py_ssize_t)(o.len * sizeof(uint32_t)));
    } else if ((result = PyList_New((Py_ssize_t)o.len))) {
        size_t start = 0;
        for (size_t k = 0; k < o.len; k++) {
            PyObject *piece = PyUnicode_DecodeUTF8((const char *)s + start, (Py_ssize_t)(o.items[k] - start), "strict");
            if (!piece) { Py_CLEAR(result); break; }
            PyList_SET_ITEM(result, (Py_ssize_t)k, piece);
            start = o.items[k];
        }
    }
    free(o.items);
    Py_XDECREF(utf8);
    return result;
}

static PyObject *Encoder_encode(EncoderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "encode(text, plain=False)");
        return NULL;
    }
    int plain = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    if (plain < 0) return NULL;
    return run(self, args[0], plain ? 1 : 0);
}

static PyObject *Encoder_split(EncoderObject *self, PyObject *text) { return run(self, text, 2); }

/* The trie of ``added`` (str -> id): every token non-empty, ids in [0, 2**31). */
static int build_trie(EncoderObject *self, PyObject *added) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    size_t cap = 1;
    while (PyDict_Next(added, &pos, &key, &value)) {
        if (!PyUnicode_Check(key) || !PyLong_Check(value) || PyUnicode_GET_LENGTH(key) == 0) {
            PyErr_SetString(PyExc_TypeError, "added must map non-empty str to int");
            return -1;
        }
        Py_ssize_t len;
        if (!PyUnicode_AsUTF8AndSize(key, &len)) return -1;
        cap += (size_t)len;
    }
    self->trie = malloc(cap * sizeof(TrieNode));
    if (!self->trie) {
        PyErr_NoMemory();
        return -1;
    }
    self->trie[0] = (TrieNode){-1, -1, -1, 0};
    self->trie_len = 1;
    pos = 0;
    while (PyDict_Next(added, &pos, &key, &value)) {
        long id = PyLong_AsLong(value);
        if (id < 0 || id > INT32_MAX) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "added token ids must lie in [0, 2**31)");
            return -1;
        }
        Py_ssize_t len;
        const uint8_t *bytes = (const uint8_t *)PyUnicode_AsUTF8AndSize(key, &len);
        if (!self->first[bytes[0]]) {
            self->first[bytes[0]] = 1;
            self->first_count++;
            self->only_first = bytes[0];
        }
        int32_t node = 0;
        for (Py_ssize_t k = 0; k < len; k++) {
            int32_t child = self->trie[node].child;
            while (child >= 0 && self->trie[child].byte != bytes[k]) child = self->trie[child].sibling;
            if (child < 0) {
                child = (int32_t)self->trie_len++;
                self->trie[child] = (TrieNode){-1, self->trie[node].child, -1, bytes[k]};
                self->trie[node].child = child;
            }
            node = child;
        }
        self->trie[node].id = (int32_t)id;
    }
    return 0;
}

static int Encoder_init(EncoderObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"ranks", "classes", "digit_run", "added", NULL};
    PyObject *ranks, *classes, *key, *value, *added = NULL;
    int digit_run;
    if (self->slots) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder is immutable");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!i|O!", names, &PyDict_Type, &ranks, &PyBytes_Type, &classes,
                                     &digit_run, &PyDict_Type, &added))
        return -1;
    if (PyBytes_GET_SIZE(classes) != CLASS_COUNT) {
        PyErr_SetString(PyExc_ValueError, "classes must hold one byte per code point (0x110000)");
        return -1;
    }
    if (digit_run != 1 && digit_run != 3) {
        PyErr_SetString(PyExc_ValueError, "digit_run must be 1 or 3");
        return -1;
    }
    Py_ssize_t count = PyDict_GET_SIZE(ranks), pos = 0;
    size_t total = 0;
    while (PyDict_Next(ranks, &pos, &key, &value)) {
        if (!PyBytes_Check(key) || !PyLong_Check(value) || PyBytes_GET_SIZE(key) == 0) {
            PyErr_SetString(PyExc_TypeError, "ranks must map non-empty bytes to int");
            return -1;
        }
        total += (size_t)PyBytes_GET_SIZE(key);
    }
    if (total >= GONE || (uint64_t)count >= (1u << 30)) {
        PyErr_SetString(PyExc_ValueError, "vocabulary too large");
        return -1;
    }
    uint32_t size = 1;
    while (size < (uint64_t)count * 2 + 2) size <<= 1; /* load factor <= 1/2 */
    self->slots = calloc(size, sizeof(Slot));
    self->arena = malloc(total ? total : 1);
    if (!self->slots || !self->arena) {
        PyErr_NoMemory();
        return -1;
    }
    self->mask = size - 1;
    size_t off = 0;
    pos = 0;
    while (PyDict_Next(ranks, &pos, &key, &value)) {
        size_t len = (size_t)PyBytes_GET_SIZE(key);
        unsigned long rank = PyLong_AsUnsignedLong(value);
        if (PyErr_Occurred() || rank >= RANK_NONE) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "ranks must lie in [0, 2**32 - 1)");
            return -1;
        }
        memcpy(self->arena + off, PyBytes_AS_STRING(key), len);
        uint32_t h = hash_bytes(self->arena + off, len), i = h & self->mask;
        while (self->slots[i].hash) i = (i + 1) & self->mask;
        self->slots[i] = (Slot){h, (uint32_t)off, (uint32_t)len, (uint32_t)rank};
        off += len;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (lookup(self, &byte, 1) == RANK_NONE) {
            PyErr_SetString(PyExc_ValueError, "every single byte must have a rank");
            return -1;
        }
    }
    if (added && PyDict_GET_SIZE(added) && build_trie(self, added) < 0) return -1;
    Py_INCREF(classes);
    self->classes = classes;
    self->cls = (const uint8_t *)PyBytes_AS_STRING(classes);
    for (size_t c = 0; c < CLASS_COUNT; c++) {
        if (self->cls[c] & C_SLOW) {
            self->has_slow = 1;
            break;
        }
    }
    self->digit_run = digit_run;
    return 0;
}

static void Encoder_dealloc(EncoderObject *self) {
    free(self->cache);
    free(self->trie);
    free(self->slots);
    free(self->arena);
    Py_XDECREF(self->classes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs;
    EncoderObject *self = (EncoderObject *)type->tp_alloc(type, 0); /* zeroed */
    return (PyObject *)self;
}

static PyMethodDef Encoder_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))Encoder_encode, METH_FASTCALL,
     "encode(text, plain=False) -> bytes | None: the ids of text as native-endian 32-bit unsigned ints. Unless\n"
     "plain, added tokens are matched first and None is returned for a text holding a SLOW character."},
    {"split", (PyCFunction)Encoder_split, METH_O, "split(text) -> list[str]: the pieces the regex makes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "node.pipeline._bytebpe.Encoder",
    .tp_basicsize = sizeof(EncoderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoder(ranks, classes, digit_run, added=None): byte-level BPE with the Qwen2 (digit_run 1) or\n"
              "Llama-3 (3) split regex; added (str -> id) are matched leftmost-longest before splitting",
    .tp_new = Encoder_new,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bytebpe", "Byte-level BPE with a hand-written split regex (see bpe_native.py).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__bytebpe(void) {
    if (PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "L", C_L) || PyModule_AddIntConstant(m, "N", C_N)
        || PyModule_AddIntConstant(m, "WS", C_WS) || PyModule_AddIntConstant(m, "SLOW", C_SLOW)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
