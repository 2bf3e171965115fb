/* Parsers for the registry's JSON documents: image manifests (OCI and Docker
 * schema 2), image indexes / manifest lists, and image configs. Input is
 * hostile: sizes, counts and every digest are checked before anything is
 * returned. */
#include "sandbox_int.h"

#include <jansson.h>

static json_t *load(const uint8_t *p, size_t n, size_t max) {
  if (!p || n == 0 || n > max)
    return NULL;
  json_error_t e;
  json_t *j = json_loadb((const char *)p, n, JSON_REJECT_DUPLICATES, &e);
  if (j && !json_is_object(j)) {
    json_decref(j);
    return NULL;
  }
  return j;
}

static const char *opt_string(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool media_type_is_index(const char *mt) {
  return strcmp(mt, GN__MT_OCI_INDEX) == 0 || strcmp(mt, GN__MT_DOCKER_LIST) == 0;
}

static bool media_type_is_manifest(const char *mt) {
  return strcmp(mt, GN__MT_OCI_MANIFEST) == 0 || strcmp(mt, GN__MT_DOCKER_MANIFEST) == 0;
}

/* Layer media types we can unpack: tar, optionally gzip or zstd compressed
 * (the unpacker detects the compression itself). Foreign/non-distributable
 * layers name external URLs, which a sandbox must not fetch. */
static bool media_type_is_layer(const char *mt) {
  static const char *const ok[] = {
      "application/vnd.oci.image.layer.v1.tar",       "application/vnd.oci.image.layer.v1.tar+gzip",
      "application/vnd.oci.image.layer.v1.tar+zstd",  "application/vnd.docker.image.rootfs.diff.tar.gzip",
      "application/vnd.docker.image.rootfs.diff.tar",
  };
  for (size_t i = 0; i < GN_ARRAY_SIZE(ok); i++)
    if (strcmp(mt, ok[i]) == 0)
      return true;
  return false;
}

static int descriptor_parse(json_t *o, gn__descriptor *ret) {
  gn__descriptor d;
  memset(&d, 0, sizeof(d));
  if (!json_is_object(o))
    return GN_EINVAL;
  const char *mt = opt_string(o, "mediaType");
  const char *digest = opt_string(o, "digest");
  json_t *size = json_object_get(o, "size");
  if (!mt || !digest || !json_is_integer(size))
    return GN_EINVAL;
  if (strlen(mt) >= sizeof(d.media_type))
    return GN_EINVAL;
  if (strncmp(digest, "sha256:", 7) != 0 && strchr(digest, ':'))
    return GN_EUNSUPPORTED; /* sha512 and friends: valid OCI, not supported here */
  if (!gn__digest_valid(digest))
    return GN_EINVAL;
  if (json_integer_value(size) < 0)
    return GN_EINVAL;
  snprintf(d.media_type, sizeof(d.media_type), "%s", mt);
  snprintf(d.digest, sizeof(d.digest), "%s", digest);
  d.size = (uint64_t)json_integer_value(size);
  *ret = d;
  return 0;
}

int gn__manifest_kind_of(const uint8_t *p, size_t n, const char *content_type, gn__manifest_kind *ret) {
  json_t *j = load(p, n, GN__MANIFEST_MAX);
  int r = GN_EINVAL;
  if (!j)
    return GN_EINVAL;
  const char *mt = opt_string(j, "mediaType");
  if (!mt && content_type && content_type[0])
    mt = content_type;
  gn__manifest_kind k = 0;
  if (mt) {
    if (media_type_is_index(mt))
      k = GN__KIND_INDEX;
    else if (media_type_is_manifest(mt))
      k = GN__KIND_MANIFEST;
  }
  if (!k) {
    /* Neither field names a known type: decide by shape, as the OCI spec
     * allows mediaType to be absent. */
    if (json_is_array(json_object_get(j, "manifests")))
      k = GN__KIND_INDEX;
    else if (json_is_array(json_object_get(j, "layers")))
      k = GN__KIND_MANIFEST;
    else {
      r = GN_EUNSUPPORTED;
      goto out;
    }
  }
  json_t *sv = json_object_get(j, "schemaVersion");
  if (!json_is_integer(sv) || json_integer_value(sv) != 2) {
    r = GN_EUNSUPPORTED; /* Docker schema 1 is deprecated and unsigned */
    goto out;
  }
  *ret = k;
  r = 0;
out:
  json_decref(j);
  return r;
}

int gn__manifest_parse(const uint8_t *p, size_t n, gn__manifest *ret) {
  gn__manifest m;
  memset(&m, 0, sizeof(m));
  json_t *j = load(p, n, GN__MANIFEST_MAX);
  int r = GN_EINVAL;
  if (!j)
    return GN_EINVAL;
  json_t *sv = json_object_get(j, "schemaVersion");
  if (!json_is_integer(sv) || json_integer_value(sv) != 2) {
    r = GN_EUNSUPPORTED;
    goto out;
  }
  const char *mt = opt_string(j, "mediaType");
  if (mt && !media_type_is_manifest(mt))
    goto out;
  if ((r = descriptor_parse(json_object_get(j, "config"), &m.config)) < 0)
    goto out;
  r = GN_EINVAL;
  if (m.config.size > GN__CONFIG_MAX) {
    r = GN_ETOOBIG;
    goto out;
  }
  json_t *layers = json_object_get(j, "layers");
  if (!json_is_array(layers))
    goto out;
  size_t count = json_array_size(layers);
  if (count > GN__LAYERS_MAX) {
    r = GN_ETOOBIG;
    goto out;
  }
  if (count) {
    m.layers = calloc(count, sizeof(*m.layers));
    if (!m.layers) {
      r = GN_ENOMEM;
      goto out;
    }
  }
  for (size_t i = 0; i < count; i++) {
    if ((r = descriptor_parse(json_array_get(layers, i), &m.layers[i])) < 0)
      goto out;
    if (!media_type_is_layer(m.layers[i].media_type)) {
      r = GN_EUNSUPPORTED;
      goto out;
    }
    if (m.layers[i].size > GN__LAYER_MAX_BYTES) {
      r = GN_ETOOBIG;
      goto out;
    }
  }
  m.layer_count = count;
  *ret = m;
  m.layers = NULL;
  r = 0;
out:
  free(m.layers);
  json_decref(j);
  return r;
}

void gn__manifest_done(gn__manifest *m) {
  if (!m)
    return;
  free(m->layers);
  m->layers = NULL;
  m->layer_count = 0;
}

int gn__index_pick(const uint8_t *p, size_t n, const char *os, const char *arch, gn__descriptor *ret) {
  json_t *j = load(p, n, GN__MANIFEST_MAX);
  int r = GN_EINVAL;
  if (!j)
    return GN_EINVAL;
  json_t *sv = json_object_get(j, "schemaVersion");
  if (!json_is_integer(sv) || json_integer_value(sv) != 2) {
    r = GN_EUNSUPPORTED;
    goto out;
  }
  const char *mt = opt_string(j, "mediaType");
  if (mt && !media_type_is_index(mt))
    goto out;
  json_t *list = json_object_get(j, "manifests");
  if (!json_is_array(list))
    goto out;
  if (json_array_size(list) > GN__INDEX_MAX) {
    r = GN_ETOOBIG;
    goto out;
  }
  /* Validate every entry, not just the one we pick: a malformed index is
   * refused whole. */
  gn__descriptor pick;
  bool found = false;
  size_t i;
  json_t *e;
  json_array_foreach(list, i, e) {
    gn__descriptor d;
    if ((r = descriptor_parse(e, &d)) < 0)
      goto out;
    r = GN_EINVAL;
    json_t *plat = json_object_get(e, "platform");
    if (plat && !json_is_object(plat))
      goto out;
    const char *pos = plat ? opt_string(plat, "os") : NULL;
    const char *parch = plat ? opt_string(plat, "architecture") : NULL;
    if (!found && pos && parch && strcmp(pos, os) == 0 && strcmp(parch, arch) == 0 &&
        media_type_is_manifest(d.media_type)) {
      pick = d;
      found = true;
    }
  }
  if (!found) {
    r = GN_ENOTFOUND;
    goto out;
  }
  if (pick.size > GN__MANIFEST_MAX) {
    r = GN_ETOOBIG;
    goto out;
  }
  *ret = pick;
  r = 0;
out:
  json_decref(j);
  return r;
}

char **gn__strv_free(char **v) {
  if (v) {
    for (char **p = v; *p; p++)
      free(*p);
    free(v);
  }
  return NULL;
}

/* A JSON array of strings (or null/absent) into a NULL-terminated vector. */
static int strv_parse(json_t *a, char ***ret) {
  if (!a || json_is_null(a)) {
    *ret = NULL;
    return 0;
  }
  if (!json_is_array(a))
    return GN_EINVAL;
  size_t n = json_array_size(a);
  if (n > GN__CONFIG_STRINGS_MAX)
    return GN_ETOOBIG;
  char **v = calloc(n + 1, sizeof(char *));
  if (!v)
    return GN_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_array_get(a, i);
    int r = GN_EINVAL;
    if (!json_is_string(s) || json_string_length(s) > GN__CONFIG_STRING_MAX ||
        strlen(json_string_value(s)) != json_string_length(s) /* embedded NUL */ ||
        (r = GN_ENOMEM, !(v[i] = strdup(json_string_value(s))))) {
      gn__strv_free(v);
      return r;
    }
  }
  *ret = v;
  return 0;
}

int gn__config_parse(const uint8_t *p, size_t n, gn__config *ret) {
  gn__config c;
  memset(&c, 0, sizeof(c));
  json_t *j = load(p, n, GN__CONFIG_MAX);
  int r = GN_EINVAL;
  if (!j)
    return GN_EINVAL;
  const char *os = opt_string(j, "os");
  const char *arch = opt_string(j, "architecture");
  if ((os && strlen(os) >= sizeof(c.os)) || (arch && strlen(arch) >= sizeof(c.arch)))
    goto out;
  snprintf(c.os, sizeof(c.os), "%s", os ? os : "");
  snprintf(c.arch, sizeof(c.arch), "%s", arch ? arch : "");
  json_t *cfg = json_object_get(j, "config");
  if (cfg && !json_is_null(cfg)) {
    if (!json_is_object(cfg))
      goto out;
    if ((r = strv_parse(json_object_get(cfg, "Entrypoint"), &c.entrypoint)) < 0 ||
        (r = strv_parse(json_object_get(cfg, "Cmd"), &c.cmd)) < 0 ||
        (r = strv_parse(json_object_get(cfg, "Env"), &c.env)) < 0)
      goto out;
    r = GN_EINVAL;
    json_t *wd = json_object_get(cfg, "WorkingDir");
    if (wd && !json_is_null(wd)) {
      if (!json_is_string(wd) || json_string_length(wd) >= sizeof(c.workdir) ||
          strlen(json_string_value(wd)) != json_string_length(wd))
        goto out;
      snprintf(c.workdir, sizeof(c.workdir), "%s", json_string_value(wd));
    }
  }
  *ret = c;
  memset(&c, 0, sizeof(c));
  r = 0;
out:
  gn__config_done(&c);
  json_decref(j);
  return r;
}

void gn__config_done(gn__config *c) {
  if (!c)
    return;
  c->entrypoint = gn__strv_free(c->entrypoint);
  c->cmd = gn__strv_free(c->cmd);
  c->env = gn__strv_free(c->env);
}
