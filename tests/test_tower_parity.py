"""Issue 32 item 4: our tower step against the authors' training code, on random-weight tiny towers built here.

DreamSim: a torch statement of its training module (training/train.py LightningPerceptualModel with PerceptualModel
(normalize_embeds=False) over ViTExtractor-style DINO / CLIP-as-DINO / OpenCLIP-as-DINO branches: 'cls' = token 0 of
the last block's output before the final LayerNorm, 'embedding' = final LayerNorm(CLS) @ proj; get_peft_model with
LoraConfig(target_modules=['qkv']); configure_optimizers' parameter list (every LoRA tensor twice, proj frozen);
torch.optim.Adam(lr 3e-4, betas (0.5, 0.999), weight_decay 0); HingeLoss with torch.round, summed / B). Two steps
from the same weights give the same losses and the same LoRA tensors (1e-5) in each of our adam_updates modes against
the matching torch Adam; with LoRA dropout, the masks our step draws are fed to peft's dropout slot (one mask per
call: the reference is embedded twice, as DreamSim's training_step does). The merged tower equals peft's
merge_and_unload() model.

AligNet: the full step (tiny ViT + Dense head, JSD on dot products, Adam -> decay towards the initial weights ->
warm-up cosine learning rate) equals an optax statement of its kauldron chain with AligNet's loss written here.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip('torch')
peft = pytest.importorskip('peft')
F = torch.nn.functional

from visim_jax.backbones import dreamsim, vit  # noqa: E402
from visim_jax.models import lora  # noqa: E402
from visim_jax.training import tower_step  # noqa: E402

B = 4
# updated weights: rtol 1e-5, and 1% of one Adam step (lr 3e-4) absolute: m / (sqrt(v) + eps) turns the float
# noise of a gradient near zero into up to a whole step; measured max |ours - peft| 1.4e-6 (one element of 768)
ATOL = 3e-6
TARGET = np.array([0.0, 0.5, 1.0, 0.7], np.float32)   # 0.5: torch.round -> 0 in the loss, >= 0.5 in the accuracy


# ------------------------------------------------------------------ a torch statement of DreamSim's towers

class TorchViT(torch.nn.Module):
  """DINO's VisionTransformer layout (DreamSim's vision_transformer.py / load_clip_as_dino): patch conv, CLS,
  position embeddings, [ln_pre], pre-norm blocks with a fused qkv Linear, final norm."""

  def __init__(self, arch):
    super().__init__()
    self.arch, c = arch, arch.width
    self.patch = torch.nn.Conv2d(3, c, arch.patch, arch.patch, bias=arch.patch_bias)
    self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, c))
    self.pos_embed = torch.nn.Parameter(torch.zeros(1, (arch.image_size // arch.patch) ** 2 + 1, c))
    self.ln_pre = torch.nn.LayerNorm(c, eps=arch.ln_eps) if arch.ln_pre else None
    self.blocks = torch.nn.ModuleList()
    for _ in range(arch.depth):
      blk = torch.nn.Module()
      blk.norm1, blk.norm2 = torch.nn.LayerNorm(c, eps=arch.ln_eps), torch.nn.LayerNorm(c, eps=arch.ln_eps)
      blk.attn = torch.nn.Module()
      blk.attn.qkv, blk.attn.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
      blk.fc1, blk.fc2 = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
      self.blocks.append(blk)
    self.norm = torch.nn.LayerNorm(c, eps=arch.ln_eps)

  def _act(self, x):
    return x * torch.sigmoid(1.702 * x) if self.arch.act == 'quick_gelu' else F.gelu(x)  # exact erf GELU

  def forward(self, x):
    n, h = x.shape[0], self.arch.heads
    x = self.patch(x).flatten(2).transpose(1, 2)
    x = torch.cat([self.cls_token.expand(n, -1, -1), x], 1) + self.pos_embed
    if self.ln_pre is not None:
      x = self.ln_pre(x)
    for blk in self.blocks:
      y = blk.norm1(x)
      t, c = y.shape[1], y.shape[2]
      qkv = blk.attn.qkv(y).reshape(n, t, 3, h, c // h).permute(2, 0, 3, 1, 4)
      q, k, v = qkv[0], qkv[1], qkv[2]
      attn = ((q @ k.transpose(-2, -1)) * (c // h) ** -0.5).softmax(-1)
      x = x + blk.attn.proj((attn @ v).transpose(1, 2).reshape(n, t, c))
      x = x + blk.fc2(self._act(blk.fc1(blk.norm2(x))))
    return x, self.norm(x)


class Extractor(torch.nn.Module):
  def __init__(self, branch):
    super().__init__()
    self.branch = branch
    self.model = TorchViT(branch.tiny)
    self.proj = torch.nn.Parameter(torch.zeros(branch.tiny.width, branch.tiny.proj_dim)) if branch.tiny.proj_dim \
        else None

  def feature(self, img):
    mean, std = (torch.tensor(v, dtype=torch.float32)[:, None, None] for v in self.branch.norm)
    tokens, normed = self.model((img - mean) / std)
    return tokens[:, 0] if self.branch.feat == 'cls' else normed[:, 0] @ self.proj


class Perceptual(torch.nn.Module):
  """PerceptualModel(lora=True, normalize_embeds=False): features concatenated, MLP = identity, 1 - cosine."""

  def __init__(self, branches):
    super().__init__()
    self.extractor_list = torch.nn.ModuleList([Extractor(b) for b in branches])

  def embed(self, img):
    return torch.cat([e.feature(img) for e in self.extractor_list], -1)

  def forward(self, a, b):
    return 1 - F.cosine_similarity(self.embed(a), self.embed(b), dim=-1)


def load_flax(model: Perceptual, params: dict):
  """Our flax params -> the torch modules (kernels transposed, conv HWIO -> OIHW)."""
  t = lambda a: torch.tensor(np.asarray(a, np.float32))
  with torch.no_grad():
    for ext in model.extractor_list:
      p, m = params[ext.branch.key], ext.model
      m.patch.weight.copy_(t(p['patch_embed']['kernel']).permute(3, 2, 0, 1))
      if m.patch.bias is not None:
        m.patch.bias.copy_(t(p['patch_embed']['bias']))
      m.cls_token.copy_(t(p['cls_token']))
      m.pos_embed.copy_(t(p['pos_embed']))
      ln = lambda mod, q: (mod.weight.copy_(t(q['scale'])), mod.bias.copy_(t(q['bias'])))
      if m.ln_pre is not None:
        ln(m.ln_pre, p['ln_pre'])
      ln(m.norm, p['norm'])
      for i, blk in enumerate(m.blocks):
        q = p[f'blocks_{i}']
        ln(blk.norm1, q['norm1'])
        ln(blk.norm2, q['norm2'])
        for mod, src in ((blk.attn.qkv, q['attn']['qkv']), (blk.attn.proj, q['attn']['proj']),
                         (blk.fc1, q['fc1']), (blk.fc2, q['fc2'])):
          base = getattr(mod, 'base_layer', mod)
          base.weight.copy_(t(src['kernel']).T)
          base.bias.copy_(t(src['bias']))
      if ext.proj is not None:
        ext.proj.copy_(t(p['proj']))


def lora_layers(pm):
  """{our LoRA path: peft's lora.Linear} of a peft-wrapped Perceptual."""
  out = {}
  for i, ext in enumerate(pm.base_model.model.extractor_list):
    for j, blk in enumerate(ext.model.blocks):
      out[f'{ext.branch.key}/blocks_{j}/attn/qkv'] = blk.attn.qkv
  return out


class MaskQueue(torch.nn.Module):
  """In peft's lora_dropout slot: multiplies by the next of the given keep masks / (1 - p) (torch's Dropout)."""

  def __init__(self, masks, rate):
    super().__init__()
    self.masks, self.rate = list(masks), rate

  def forward(self, x):
    m = torch.tensor(self.masks.pop(0), dtype=x.dtype)
    return x * m / (1 - self.rate)


def dreamsim_torch_step(pm, opt, imgs, target, margin):
  """LightningPerceptualModel.training_step + the optimiser step."""
  ref, x0, x1 = imgs
  d0, d1 = pm(ref, x0), pm(ref, x1)
  logit = d0 - d1
  y = torch.round(target)
  y = -1 * (1 - 2 * y)
  loss = torch.max(torch.zeros(logit.shape), margin + (-1 * (logit * y))).sum() / target.shape[0]
  opt.zero_grad()
  loss.backward()
  opt.step()
  return float(loss)


def _setup(adam_updates, dropout):
  name = 'dreamsim_ensemble'
  bb = dreamsim.dreamsim_backbone(name, tiny=True)
  _, branches = dreamsim.MODELS[name]
  cfg = lora.Config(r=4, alpha=8, dropout=dropout)
  hp = tower_step.Hparams(tune='lora', lora=cfg, loss='hinge', similarity='cosine', lr=3e-4, b1=0.5, b2=0.999,
                          adam_updates=adam_updates)
  tw = tower_step.tower(bb, feature='concat')
  state, frozen = tower_step.init_state(hp, tw, bb.variables)
  rng = np.random.default_rng(0)   # B non-zero, so that both A and B move in the first step
  tl = {k: {'a': v['a'], 'b': jnp.asarray(rng.normal(0, 0.05, v['b'].shape), jnp.float32)}
        for k, v in state.trainable['lora'].items()}
  state = state._replace(trainable={'lora': tl}, opt_state=tower_step.optimizer(hp).init({'lora': tl}))

  model = Perceptual(branches)
  load_flax(model, bb.variables['params'])
  pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, bias='none',
                                                  target_modules=['qkv']))
  with torch.no_grad():
    for path, layer in lora_layers(pm).items():
      layer.lora_A['default'].weight.copy_(torch.tensor(np.asarray(tl[path]['a']).T))
      layer.lora_B['default'].weight.copy_(torch.tensor(np.asarray(tl[path]['b']).T))
  # configure_optimizers: the peft model's parameters, then every extractor's model's again, then the proj
  params = list(pm.parameters())
  for ext in pm.extractor_list:
    params += list(ext.model.parameters())
  for ext in pm.extractor_list:
    if ext.branch.feat == 'embedding':
      params += [ext.proj]
  if adam_updates == 'single':
    params = list({id(p): p for p in params}.values())
  opt = torch.optim.Adam(params, lr=3e-4, betas=(0.5, 0.999), weight_decay=0.0,
                         foreach=adam_updates == 'twice_foreach')
  imgs = rng.uniform(0, 1, (3, B, 3, 32, 32)).astype(np.float32)
  ours = jnp.asarray(np.transpose(imgs, (1, 0, 3, 4, 2)) * 255.0)   # (B, 3, H, W, C) on the 0..255 scale
  return hp, tw, state, frozen, pm, opt, imgs, ours


@pytest.mark.parametrize('adam_updates', ['twice', 'single', 'twice_foreach'])
def test_dreamsim_lora_step_equals_peft(adam_updates):
  hp, tw, state, frozen, pm, opt, imgs, ours = _setup(adam_updates, 0.0)
  batch = tower_step.Batch(ours, jnp.asarray(TARGET))
  program = tower_step.step_program(hp, tw)
  timgs = [torch.tensor(i) for i in imgs]
  for _ in range(2):
    want = dreamsim_torch_step(pm, opt, timgs, torch.tensor(TARGET), 0.05)
    state, metrics = program(state, frozen, batch)
    np.testing.assert_allclose(float(metrics['loss']), want, rtol=1e-5)
  for path, layer in lora_layers(pm).items():
    np.testing.assert_allclose(state.trainable['lora'][path]['a'], layer.lora_A['default'].weight.detach().numpy().T,
                               rtol=1e-5, atol=ATOL, err_msg=path)
    np.testing.assert_allclose(state.trainable['lora'][path]['b'], layer.lora_B['default'].weight.detach().numpy().T,
                               rtol=1e-5, atol=ATOL, err_msg=path)

  # the merged tower = peft's merge_and_unload() model, on DreamSim's training distance
  merged = tower_step.merged_variables(hp, state, frozen)
  plain = pm.merge_and_unload()
  with torch.no_grad():
    want_d = plain(timgs[0], timgs[1]).numpy()
  e = tw.apply_fn(merged, tw.normalise(ours.reshape((-1, 32, 32, 3)), jnp.float32))[1]['concat'].reshape(B, 3, -1)
  got_d = 1 - np.sum(np.asarray(e[:, 0]) * np.asarray(e[:, 1]), -1) / (
      np.linalg.norm(e[:, 0], axis=-1) * np.linalg.norm(e[:, 1], axis=-1))
  np.testing.assert_allclose(got_d, want_d, rtol=1e-5, atol=1e-6)


def test_dreamsim_lora_step_with_dropout_equals_peft_fed_our_masks():
  rate = 0.3
  hp, tw, state, frozen, pm, opt, imgs, ours = _setup('twice', rate)
  batch = tower_step.Batch(ours, jnp.asarray(TARGET))
  order = sorted(state.trainable['lora'])
  layers = lora_layers(pm)
  key = jax.random.fold_in(tower_step.step_key(hp, jnp.int32(0)), 0)
  tokens = (32 // 8) ** 2 + 1
  for i, path in enumerate(order):   # our batch rows are (ref, p0, ref, p1) per triplet; torch calls them apart
    m = np.asarray(lora.dropout_mask(key, i, 0, (B * 4, tokens, 32), rate)).reshape(B, 4, tokens, 32)
    layers[path].lora_dropout['default'] = MaskQueue([m[:, j] for j in range(4)], rate)
  want = dreamsim_torch_step(pm, opt, [torch.tensor(i) for i in imgs], torch.tensor(TARGET), 0.05)
  state, metrics = tower_step.step_program(hp, tw)(state, frozen, batch)
  np.testing.assert_allclose(float(metrics['loss']), want, rtol=1e-5)
  for path, layer in layers.items():
    assert not layer.lora_dropout['default'].masks, path   # every mask used: 4 calls per layer
    np.testing.assert_allclose(state.trainable['lora'][path]['a'], layer.lora_A['default'].weight.detach().numpy().T,
                               rtol=1e-5, atol=ATOL, err_msg=path)
    np.testing.assert_allclose(state.trainable['lora'][path]['b'], layer.lora_B['default'].weight.detach().numpy().T,
                               rtol=1e-5, atol=ATOL, err_msg=path)


# ------------------------------------------------------------------ AligNet: the full step against its chain

def _alignet_jsd(e, target_sims, tau):
  """AligNet's losses.py JSDTripletLoss (normalize=False), written out."""
  dots = [jnp.sum(e[:, i] * e[:, j], -1) for i, j in ((0, 1), (0, 2), (1, 2))]
  p = jax.nn.softmax(target_sims, -1)
  q = jax.nn.softmax(jnp.stack(dots, -1) / tau, -1)
  m = (p + q) / 2
  neg_ent = lambda a: jnp.sum(jnp.where(a == 0, 0.0, a * jnp.log(a)), -1)
  ce = lambda a, b: -jnp.sum(a * jnp.log(b), -1)
  return (((neg_ent(p) + ce(p, m)) + (neg_ent(q) + ce(q, m))) / 2).mean()


def _kauldron_decay_to_init(wd):
  """kauldron's decay_to_init: the update plus wd (params - params at init)."""
  def init(params):
    return jax.tree.map(jnp.array, params)

  def update(u, p0, params):
    return jax.tree.map(lambda a, b, c: a + wd * (b - c), u, params, p0), p0
  return optax.GradientTransformation(init, update)


def test_alignet_full_step_equals_its_optax_chain():
  bb = vit.vit_backbone('dino_vitb16', tiny=True)
  tw = tower_step.tower(bb, feature='pooled', head='affine', head_size=8)
  hp = tower_step.Hparams(tune='full', loss='jsd', similarity='dot', tau=2.0, target_tau=1.0, lr=1e-3, b1=0.9,
                          b2=0.999, weight_decay=1.0, schedule='cosine', warmup_steps=2, steps=6)
  state, frozen = tower_step.init_state(hp, tw, bb.variables, image_shape=(32, 32, 3))
  rng = np.random.default_rng(1)
  images = jnp.asarray(rng.integers(0, 256, (3, 5, 3, 32, 32, 3)), jnp.uint8)
  sims = jnp.asarray(rng.normal(0, 2, (3, 5, 3)), jnp.float32)

  chain = optax.chain(optax.scale_by_adam(), _kauldron_decay_to_init(1.0),
                      optax.scale_by_learning_rate(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 2, 6)))
  params = jax.tree.map(jnp.array, state.trainable)

  def loss_fn(p, imgs, t):
    x = bb.preprocess.normalise(imgs.reshape((-1, 32, 32, 3)), jnp.float32)
    f = bb.apply_fn({'params': p['tower']}, x)[1]['pooled']
    e = (f @ p['head']['w'] + p['head']['b']).reshape(5, 3, -1)
    return _alignet_jsd(e, t, 2.0)
  ost = chain.init(params)
  program = tower_step.step_program(hp, tw)
  for s in range(3):
    loss, g = jax.value_and_grad(loss_fn)(params, images[s], sims[s])
    u, ost = chain.update(g, ost, params)
    params = optax.apply_updates(params, u)
    state, metrics = program(state, frozen, tower_step.Batch(images[s], sims[s]))
    np.testing.assert_allclose(float(metrics['loss']), float(loss), rtol=1e-5)
  for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(state.trainable)[0], jax.tree.leaves(params)):
    name = jax.tree_util.keystr(path)
    got, want = np.asarray(got), np.asarray(want)
    if name.endswith("['qkv']['bias']"):
      # the key bias: its gradient is 0 in exact arithmetic (softmax ignores a shift of all logits); Adam with
      # eps 1e-8 turns the float noise there into whole steps, on both sides differently
      got, want = np.delete(got, np.s_[32:64]), np.delete(want, np.s_[32:64])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=name)
  assert not np.allclose(params['head']['w'], 0)
