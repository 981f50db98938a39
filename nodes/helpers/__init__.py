"""Plain functions and tables behind the node declarations: model folders, image/mask/latent/text operations, file codecs, precision and previews."""
