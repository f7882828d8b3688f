// Placeholder so the component library has a source until its real files land; delete it then.
