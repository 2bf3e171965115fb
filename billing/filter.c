/* The offer filter language of `gpunet offers` and `gpunet rent`:
 * "gpu=rtx4090 vram>=24 price<=0.50" parsed into terms and matched on offers. */
#include <gpunet/billing.h>
#include <gpunet/filter.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <strings.h>

static bool skip_prefix(const char **s, const char *prefix) {
  size_t n = strlen(prefix);
  if (strncmp(*s, prefix, n) != 0)
    return false;
  *s += n;
  return true;
}

void gn_gpu_model_norm(const char *s, char *buf, size_t cap) {
  char tmp[256];
  size_t n = 0;
  for (; *s && n + 1 < sizeof(tmp); s++) {
    if (*s == ' ' || *s == '-' || *s == '_' || *s == '\t')
      continue;
    tmp[n++] = (char)tolower((unsigned char)*s);
  }
  tmp[n] = '\0';
  const char *t = tmp;
  skip_prefix(&t, "nvidia");
  skip_prefix(&t, "geforce");
  snprintf(buf, cap, "%s", t);
}

static const char *const key_names[] = {
    [GN_FILTER_GPU] = "gpu",           [GN_FILTER_VRAM] = "vram",           [GN_FILTER_PRICE] = "price",
    [GN_FILTER_COUNT] = "count",       [GN_FILTER_SIMULATED] = "simulated", [GN_FILTER_CONFINED] = "confined",
    [GN_FILTER_TRAINING] = "training",
};

/* Longest operators first so "<=" is not read as "<". */
static const struct {
  const char *text;
  enum gn_filter_op op;
} ops[] = {
    {"!=", GN_FILTER_NE}, {"<=", GN_FILTER_LE}, {">=", GN_FILTER_GE}, {"==", GN_FILTER_EQ},
    {"=", GN_FILTER_EQ},  {"<", GN_FILTER_LT},  {">", GN_FILTER_GT},
};

static const char *op_text(enum gn_filter_op op) {
  for (size_t i = 0; i < GN_ARRAY_SIZE(ops); i++)
    if (ops[i].op == op)
      return ops[i].text;
  return "?";
}

/* A whole number, with an optional GiB suffix for vram. */
static bool parse_uint(const char *v, bool allow_gib, uint64_t *ret) {
  uint64_t n = 0;
  const char *p = v;
  for (; isdigit((unsigned char)*p); p++) {
    if (n > UINT32_MAX)
      return false;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  if (p == v)
    return false;
  if (allow_gib && *p) {
    static const char *const suffixes[] = {"g", "gb", "gib"};
    bool ok = false;
    for (size_t i = 0; i < GN_ARRAY_SIZE(suffixes); i++)
      ok = ok || strcasecmp(p, suffixes[i]) == 0;
    if (!ok)
      return false;
    p += strlen(p);
  }
  if (*p)
    return false;
  *ret = n;
  return true;
}

/* Parses one term ("vram>=24") of length len into t. */
static int parse_term(const char *s, size_t len, gn_filter_term *t, char *err, size_t cap) {
  char term[GN_FILTER_MAX_LEN + 1];
  memcpy(term, s, len);
  term[len] = '\0';
  size_t klen = 0;
  while (klen < len && (isalpha((unsigned char)term[klen]) || term[klen] == '_'))
    klen++;
  const char *rest = term + klen;
  size_t oplen = 0;
  for (size_t i = 0; i < GN_ARRAY_SIZE(ops); i++) {
    size_t n = strlen(ops[i].text);
    if (strncmp(rest, ops[i].text, n) == 0) {
      t->op = ops[i].op;
      oplen = n;
      break;
    }
  }
  char key[32];
  snprintf(key, sizeof(key), "%.*s", (int)(klen < sizeof(key) ? klen : sizeof(key) - 1), term);
  if (klen == 0 || oplen == 0) {
    snprintf(err, cap, "bad filter term '%.100s': want KEY OP VALUE like vram>=24 (operators: = != < <= > >=)", term);
    return GN_EINVAL;
  }
  size_t k = GN_ARRAY_SIZE(key_names);
  for (size_t i = 0; i < GN_ARRAY_SIZE(key_names); i++)
    if (strcasecmp(key, key_names[i]) == 0)
      k = i;
  if (k == GN_ARRAY_SIZE(key_names)) {
    snprintf(err, cap, "unknown filter key '%s' (known: gpu, vram, price, count, simulated, confined, training)", key);
    return GN_EINVAL;
  }
  t->key = (enum gn_filter_key)k;
  const char *v = rest + oplen;
  if (!*v) {
    snprintf(err, cap, "filter term '%.100s' has no value", term);
    return GN_EINVAL;
  }
  bool eq_only = t->key == GN_FILTER_GPU || t->key == GN_FILTER_SIMULATED || t->key == GN_FILTER_CONFINED ||
                 t->key == GN_FILTER_TRAINING;
  if (eq_only && t->op != GN_FILTER_EQ && t->op != GN_FILTER_NE) {
    snprintf(err, cap, "operator '%s' does not apply to %s (use = or !=)", op_text(t->op), key_names[k]);
    return GN_EINVAL;
  }
  switch (t->key) {
  case GN_FILTER_GPU:
    /* Kept raw until the whole model is known (see gn_filter_parse). */
    if (strlen(v) >= sizeof(t->text)) {
      snprintf(err, cap, "gpu model '%.40s...' is too long", v);
      return GN_ETOOBIG;
    }
    memcpy(t->text, v, strlen(v) + 1);
    return 0;
  case GN_FILTER_VRAM:
  case GN_FILTER_COUNT:
    if (!parse_uint(v, t->key == GN_FILTER_VRAM, &t->num)) {
      snprintf(err, cap, "bad number '%.100s' for %s%s", v, key_names[k], t->key == GN_FILTER_VRAM ? " (GiB)" : "");
      return GN_EINVAL;
    }
    return 0;
  case GN_FILTER_PRICE:
    if (gn_price_parse(v, &t->num) < 0) {
      snprintf(err, cap, "bad price '%.100s': want an amount per GPU-hour like 0.50", v);
      return GN_EINVAL;
    }
    return 0;
  case GN_FILTER_SIMULATED:
  case GN_FILTER_CONFINED:
  case GN_FILTER_TRAINING: {
    bool yes = strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0 || strcmp(v, "1") == 0;
    bool no = strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0 || strcmp(v, "0") == 0;
    if (!yes && !no) {
      snprintf(err, cap, "%s must be true or false, not '%.100s'", key_names[k], v);
      return GN_EINVAL;
    }
    t->num = yes;
    return 0;
  }
  }
  return GN_EINVAL;
}

int gn_filter_parse(const char *s, gn_filter *ret, char *err, size_t cap) {
  if (!s || !ret)
    return GN_EINVAL;
  size_t len = strnlen(s, GN_FILTER_MAX_LEN + 1);
  if (len > GN_FILTER_MAX_LEN) {
    snprintf(err, cap, "filter longer than %d bytes", GN_FILTER_MAX_LEN);
    return GN_ETOOBIG;
  }
  gn_filter f = {.count = 0};
  size_t i = 0;
  while (i < len) {
    if (s[i] == ' ' || s[i] == ',' || s[i] == '\t' || s[i] == '\n') {
      i++;
      continue;
    }
    size_t start = i;
    while (i < len && s[i] != ' ' && s[i] != ',' && s[i] != '\t' && s[i] != '\n')
      i++;
    if (f.count == GN_FILTER_MAX_TERMS) {
      snprintf(err, cap, "too many filter terms (at most %d)", GN_FILTER_MAX_TERMS);
      return GN_ETOOBIG;
    }
    /* A bare word after a gpu term continues its model: gpu=RTX 4090. */
    if (f.count && f.terms[f.count - 1].key == GN_FILTER_GPU && strcspn(s + start, "=<>!") >= i - start) {
      gn_filter_term *t = &f.terms[f.count - 1];
      size_t have = strlen(t->text);
      if (have + 1 + (i - start) >= sizeof(t->text)) {
        snprintf(err, cap, "gpu model '%.40s...' is too long", t->text);
        return GN_ETOOBIG;
      }
      t->text[have] = ' ';
      memcpy(t->text + have + 1, s + start, i - start);
      t->text[have + 1 + (i - start)] = '\0';
      continue;
    }
    int r = parse_term(s + start, i - start, &f.terms[f.count], err, cap);
    if (r < 0)
      return r;
    f.count++;
  }
  for (size_t k = 0; k < f.count; k++) {
    gn_filter_term *t = &f.terms[k];
    if (t->key != GN_FILTER_GPU)
      continue;
    char norm[sizeof(t->text)];
    gn_gpu_model_norm(t->text, norm, sizeof(norm));
    if (!norm[0]) {
      snprintf(err, cap, "gpu model '%s' names no model", t->text);
      return GN_EINVAL;
    }
    memcpy(t->text, norm, strlen(norm) + 1);
  }
  *ret = f;
  return 0;
}

static bool cmp(uint64_t a, enum gn_filter_op op, uint64_t b) {
  switch (op) {
  case GN_FILTER_EQ:
    return a == b;
  case GN_FILTER_NE:
    return a != b;
  case GN_FILTER_LT:
    return a < b;
  case GN_FILTER_LE:
    return a <= b;
  case GN_FILTER_GT:
    return a > b;
  case GN_FILTER_GE:
    return a >= b;
  }
  return false;
}

static bool term_match(const gn_filter_term *t, const gn_offer *o) {
  switch (t->key) {
  case GN_FILTER_GPU: {
    char model[sizeof(o->gpu_model) + 1];
    char bounded[sizeof(o->gpu_model) + 1];
    /* The offer came off the wire: do not trust it to be terminated. */
    snprintf(bounded, sizeof(bounded), "%.*s", (int)sizeof(o->gpu_model), o->gpu_model);
    gn_gpu_model_norm(bounded, model, sizeof(model));
    bool found = strstr(model, t->text) != NULL;
    return t->op == GN_FILTER_EQ ? found : !found;
  }
  case GN_FILTER_VRAM:
    return cmp((uint64_t)llround(o->vram_mib / 1024.0), t->op, t->num);
  case GN_FILTER_PRICE:
    return cmp(o->price_uper_hour, t->op, t->num);
  case GN_FILTER_COUNT:
    return cmp(o->gpus_free, t->op, t->num);
  case GN_FILTER_SIMULATED:
    return cmp(o->simulated ? 1 : 0, t->op, t->num);
  case GN_FILTER_CONFINED:
    /* Confined: the provider's signed offer admits to no missing isolation. */
    return cmp(!o->no_userns && !o->unenforced_limits ? 1 : 0, t->op, t->num);
  case GN_FILTER_TRAINING:
    /* The provider's signed offer says it takes ranks of training jobs. */
    return cmp(o->training ? 1 : 0, t->op, t->num);
  }
  return false;
}

bool gn_filter_match(const gn_filter *f, const gn_offer *o) {
  for (size_t i = 0; i < f->count; i++)
    if (!term_match(&f->terms[i], o))
      return false;
  return true;
}
