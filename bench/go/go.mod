module resourceconsist.bench/goorig

go 1.19

require kusionstack.io/resourceconsist v0.0.7

// The original pins these in its own go.mod; replace directives of a dependency do not apply
// to the module requiring it, so they are repeated here to build the original as released.
replace (
	github.com/go-logr/logr => github.com/go-logr/logr v0.4.0
	github.com/go-logr/zapr => github.com/go-logr/zapr v0.4.0
	k8s.io/api => k8s.io/api v0.22.6
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.22.6
	k8s.io/apimachinery => k8s.io/apimachinery v0.22.6
	k8s.io/client-go => k8s.io/client-go v0.22.6
	k8s.io/component-base => k8s.io/component-base v0.22.6
	k8s.io/klog/v2 => k8s.io/klog/v2 v2.9.0
	k8s.io/kube-openapi => k8s.io/kube-openapi v0.0.0-20211109043538-20434351676c
	sigs.k8s.io/controller-runtime => sigs.k8s.io/controller-runtime v0.10.3
)
